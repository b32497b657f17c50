//! The signatures of cairn's built-in stages (`uses = "NAME"`): which
//! inputs and outputs each reads and writes, by name, and which settings its
//! `with` table takes. The manifest is checked against these; the
//! implementations live in `crate::builtins`.

/// One built-in stage's signature.
#[derive(Debug)]
pub struct BuiltinSpec {
    pub name: &'static str,
    /// Bumped whenever the built-in's output for the same inputs and
    /// settings changes: it is part of every such stage's fingerprint.
    pub version: u32,
    pub summary: &'static str,
    pub inputs: &'static [Port],
    pub outputs: &'static [Port],
    pub settings: &'static [Setting],
}

/// A named input or output a built-in reads or writes.
#[derive(Debug)]
pub struct Port {
    pub name: &'static str,
    pub about: &'static str,
}

/// One key of a built-in's `with` table.
#[derive(Debug)]
pub struct Setting {
    pub name: &'static str,
    pub kind: SettingKind,
    pub required: bool,
    pub about: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingKind {
    /// A string; `{params.X}`, `{in.X}` and `{out.X}` are interpolated.
    String,
    /// A string that names a file or directory: safe as one path component
    /// (letters, digits, `.`, `_`, `-`, not starting with `.`).
    Name,
    /// A non-negative integer.
    Count,
    Bool,
    /// A zstd compression level, 1 to 19.
    Level,
    /// An array of strings.
    Strings,
    /// A table of NAME = non-negative integer.
    Counts,
}

impl SettingKind {
    pub fn describe(self) -> &'static str {
        match self {
            SettingKind::String => "a string",
            SettingKind::Name => "a name (letters, digits, `.`, `_`, `-`)",
            SettingKind::Count => "a non-negative integer",
            SettingKind::Bool => "a boolean",
            SettingKind::Level => "an integer from 1 to 19",
            SettingKind::Strings => "an array of strings",
            SettingKind::Counts => "a table of NAME = non-negative integer",
        }
    }
}

/// Every built-in stage.
pub const BUILTINS: &[BuiltinSpec] = &[
    BuiltinSpec {
        name: "freeze",
        version: 1,
        summary: "a checked, content-addressed freeze of the selected items, split by split",
        inputs: &[
            Port {
                name: "selection",
                about: "a JSON array or JSONL file of the selected items, each with an ID and a split",
            },
            Port {
                name: "items",
                about: "a directory with one subdirectory per item, named by its ID",
            },
        ],
        outputs: &[Port {
            name: "freeze",
            about: "the freeze directory: manifest.json, SHA256SUMS and items/ID/",
        }],
        settings: &[
            Setting {
                name: "name",
                kind: SettingKind::Name,
                required: true,
                about: "the dataset's name",
            },
            Setting {
                name: "version",
                kind: SettingKind::Name,
                required: true,
                about: "the dataset's version",
            },
            Setting {
                name: "id",
                kind: SettingKind::String,
                required: false,
                about: "the field that holds an item's ID (default `id`)",
            },
            Setting {
                name: "split",
                kind: SettingKind::String,
                required: false,
                about: "the field that holds an item's split (default `split`)",
            },
            Setting {
                name: "group",
                kind: SettingKind::String,
                required: false,
                about: "the field that groups items (e.g. `repo`) for the group checks",
            },
            Setting {
                name: "sizes",
                kind: SettingKind::Counts,
                required: false,
                about: "the exact number of items each split must have; no other split may appear",
            },
            Setting {
                name: "disjoint_groups",
                kind: SettingKind::Bool,
                required: false,
                about: "no group may have items in two splits (default true when `group` is set)",
            },
            Setting {
                name: "max_per_group",
                kind: SettingKind::Count,
                required: false,
                about: "at most this many items per group",
            },
            Setting {
                name: "require",
                kind: SettingKind::Strings,
                required: false,
                about: "IDs that must be in the freeze",
            },
        ],
    },
    BuiltinSpec {
        name: "export",
        version: 1,
        summary: "a reproducible tar + zstd bundle of a freeze, with its SHA-256 and an in-toto attestation inside",
        inputs: &[Port {
            name: "freeze",
            about: "a freeze directory written by `uses = \"freeze\"`",
        }],
        outputs: &[
            Port {
                name: "bundle",
                about: "the archive (`.tar.zst`)",
            },
            Port {
                name: "sha256",
                about: "the archive's SHA-256, in `sha256sum` format",
            },
        ],
        settings: &[Setting {
            name: "level",
            kind: SettingKind::Level,
            required: false,
            about: "the zstd compression level, 1 to 19 (default 3)",
        }],
    },
    BuiltinSpec {
        name: "register",
        version: 1,
        summary: "verify a bundle, then import it into a registry directory",
        inputs: &[
            Port {
                name: "bundle",
                about: "an archive written by `uses = \"export\"`",
            },
            Port {
                name: "sha256",
                about: "the archive's expected SHA-256, in `sha256sum` format",
            },
        ],
        outputs: &[Port {
            name: "receipt",
            about: "a JSON receipt: name, version, digests and where it was registered",
        }],
        settings: &[Setting {
            name: "into",
            kind: SettingKind::String,
            required: true,
            about: "the registry directory (relative to the project root, or absolute)",
        }],
    },
];

/// The built-in called `name`.
pub fn builtin(name: &str) -> Option<&'static BuiltinSpec> {
    BUILTINS.iter().find(|b| b.name == name)
}

/// Whether `text` is safe as a single path component.
pub fn is_safe_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 200
        && !text.starts_with('.')
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}
