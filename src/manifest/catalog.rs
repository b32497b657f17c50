//! The signatures of cairn's built-in stages (`uses = "NAME"`): which
//! inputs and outputs each reads and writes, by name, and which settings its
//! `with` table takes. The manifest is checked against these; the
//! implementations live in `crate::builtins`.

use super::settings;

/// One built-in stage's signature.
#[derive(Debug)]
pub struct BuiltinSpec {
    pub name: &'static str,
    /// Bumped whenever the built-in's output for the same inputs and
    /// settings changes: it is part of every such stage's fingerprint.
    pub version: u32,
    pub summary: &'static str,
    pub inputs: &'static [Port],
    /// Whether the stage may declare inputs of any name (besides these).
    pub open_inputs: bool,
    pub outputs: &'static [Port],
    pub settings: &'static [Setting],
    /// A deeper check of the whole `with` table (as JSON), given the names
    /// of the stage's inputs; its message is shown at `with`.
    pub validate: Option<Validate>,
}

/// Checks a whole `with` table, given the stage's input names.
pub type Validate = fn(&serde_json::Value, &[&str]) -> Result<(), String>;

/// A named input or output a built-in reads or writes.
#[derive(Debug)]
pub struct Port {
    pub name: &'static str,
    pub about: &'static str,
    pub required: bool,
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
    /// Any value: arrays of tables (predicates, checks), checked as a whole
    /// by the built-in's `validate`.
    Json,
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
            SettingKind::Json => "a value",
        }
    }
}

const fn port(name: &'static str, about: &'static str) -> Port {
    Port {
        name,
        about,
        required: true,
    }
}

const fn optional_port(name: &'static str, about: &'static str) -> Port {
    Port {
        name,
        about,
        required: false,
    }
}

const fn setting(
    name: &'static str,
    kind: SettingKind,
    required: bool,
    about: &'static str,
) -> Setting {
    Setting {
        name,
        kind,
        required,
        about,
    }
}

use SettingKind::{Bool, Count, Counts, Json, Level, Name, Strings};

/// Every built-in stage.
pub const BUILTINS: &[BuiltinSpec] = &[
    BuiltinSpec {
        name: "select",
        version: 1,
        summary: "a deterministic, tiered, group-balanced selection with a cap, a must-keep list and an explicit shortfall",
        inputs: &[
            port(
                "candidates",
                "a JSON array or JSONL file of candidate records",
            ),
            optional_port(
                "must_keep",
                "IDs (strings or records) that must be selected",
            ),
            optional_port(
                "keep",
                "IDs (strings or records) taken first when eligible, e.g. an older freeze; those that are not are named in the report",
            ),
            optional_port(
                "exclude",
                "IDs (strings or records) that must not be selected",
            ),
            optional_port(
                "order",
                "IDs in the order to take them (a plan's main list, then its reserves), before tiers",
            ),
        ],
        open_inputs: false,
        outputs: &[
            port(
                "selected",
                "the selected records, JSONL, in selection order",
            ),
            optional_port("reserves", "the next records in the same order, JSONL"),
            optional_port(
                "planned",
                "the selected records, then the reserves, JSONL: the list the next stages work through",
            ),
            optional_port(
                "report",
                "counts per tier and group, and the shortfall, JSON",
            ),
        ],
        settings: &[
            setting(
                "key",
                SettingKind::String,
                false,
                "the field naming a record (default `id`)",
            ),
            setting(
                "where",
                Json,
                false,
                "predicates every candidate must pass: `[{ field, equals | in | not_in | contains | min | max | exists }]`",
            ),
            setting(
                "tiers",
                Strings,
                false,
                "fields ordering records into tiers, ascending",
            ),
            setting(
                "prefer",
                Json,
                false,
                "preferences inside a tier: `[{ field, order = [values] }]`",
            ),
            setting(
                "group",
                SettingKind::String,
                false,
                "round-robin over this field inside each tier",
            ),
            setting("max_per_group", Count, false, "at most this many per group"),
            setting("target", Count, false, "how many to select (or `quotas`)"),
            setting(
                "stage",
                SettingKind::String,
                false,
                "with `quotas`: the field naming a record's stage",
            ),
            setting(
                "quotas",
                Counts,
                false,
                "a target per stage, each filled only from its own stage (in the order of their names), the cap counted across them",
            ),
            setting(
                "reserves",
                Count,
                false,
                "how many reserves to keep after them (per stage, with `quotas`)",
            ),
            setting(
                "allow_shortfall",
                Bool,
                false,
                "accept fewer than a target (always reported)",
            ),
        ],
        validate: Some(settings::check_select),
    },
    BuiltinSpec {
        name: "split",
        version: 1,
        summary: "a group-isolated split with exact sizes",
        inputs: &[
            port(
                "items",
                "a JSON array or JSONL file of records, in preference order",
            ),
            optional_port(
                "previous",
                "an earlier version's assignments (records with the ID and split): each ID still present stays in its split",
            ),
        ],
        open_inputs: false,
        outputs: &[
            port(
                "assignments",
                "the assigned records with their split, JSONL",
            ),
            optional_port("report", "sizes wanted and got, groups per split, JSON"),
        ],
        settings: &[
            setting(
                "key",
                SettingKind::String,
                false,
                "the field naming a record (default `id`)",
            ),
            setting(
                "group",
                SettingKind::String,
                true,
                "no value of this field is in two splits",
            ),
            setting("sizes", Counts, true, "the exact size of each split"),
            setting(
                "field",
                SettingKind::String,
                false,
                "the field written into each record (default `split`)",
            ),
            setting(
                "allow_shortfall",
                Bool,
                false,
                "when sizes cannot be met, keep the largest feasible split and record the shortfall",
            ),
        ],
        validate: Some(|with, _| settings::check::<settings::SplitSettings>(with)),
    },
    BuiltinSpec {
        name: "gate",
        version: 1,
        summary: "declarative checks over JSON/JSONL outputs that stop the pipeline",
        inputs: &[],
        open_inputs: true,
        outputs: &[port("report", "every check with its figures, JSON")],
        settings: &[setting(
            "checks",
            Json,
            true,
            "`[{ input, count | min_count | max_count | unique | group + max_per_group | same_as | subset_of | disjoint_from | field + min/max | share = { where, min, max }, where }]`",
        )],
        validate: Some(settings::check_gate),
    },
    BuiltinSpec {
        name: "groups",
        version: 1,
        summary: "the items a sampled stage's groups allow to train on (mixed groups; errors to re-sample)",
        inputs: &[port(
            "samples",
            "a sampled stage's merged output (one line per item, with `group`)",
        )],
        open_inputs: false,
        outputs: &[
            port("keep", "the kept items' records, JSONL"),
            port(
                "resample",
                "the keys of items with a sample in error, JSONL",
            ),
            port(
                "report",
                "items by group label, kept and to re-sample, JSON",
            ),
        ],
        settings: &[
            setting(
                "where",
                Json,
                false,
                "predicates on the lines considered, e.g. `[{ field = \"split\", equals = \"train\" }]`",
            ),
            setting(
                "keep",
                Json,
                false,
                "the group labels kept (default `[\"mixed\"]`; also `all-0`, `all-1`)",
            ),
        ],
        validate: Some(|with, _| settings::check::<settings::GroupsSettings>(with)),
    },
    BuiltinSpec {
        name: "oci-mirror",
        version: 2,
        summary: "copy container images between OCI layouts and registries, under a per-shard tag quota",
        inputs: &[
            port(
                "images",
                "records naming the images wanted (`id` and `image` fields by default)",
            ),
            optional_port(
                "layout",
                "an OCI image layout the images are read from, so its content enters the fingerprint (use `source = \"oci:{in.layout}\"`)",
            ),
        ],
        open_inputs: false,
        outputs: &[port(
            "mirrored",
            "per record: source, target reference and manifest digest, JSONL",
        )],
        settings: &[
            setting(
                "source",
                SettingKind::String,
                true,
                "`oci:PATH` or `http(s)://HOST[:PORT][/PREFIX]`",
            ),
            setting(
                "target",
                SettingKind::String,
                true,
                "`oci:PATH` or `http(s)://HOST[:PORT][/PREFIX]`",
            ),
            setting(
                "key",
                SettingKind::String,
                false,
                "the field naming a record (default `id`)",
            ),
            setting(
                "image",
                SettingKind::String,
                false,
                "the field naming its image (default `image`)",
            ),
            setting(
                "prefix",
                SettingKind::String,
                false,
                "target repositories are PREFIX-NN (default `task`)",
            ),
            setting(
                "shards",
                Count,
                false,
                "how many target repositories (default 80)",
            ),
            setting(
                "quota",
                Count,
                false,
                "at most this many tags per shard (default 100)",
            ),
            setting(
                "token_env",
                SettingKind::String,
                false,
                "a variable (list it in `secrets`) holding a bearer token",
            ),
            setting(
                "username_env",
                SettingKind::String,
                false,
                "a variable (list it in `secrets`) holding the registry user, sent as its challenge asks (Basic, or to its token service)",
            ),
            setting(
                "password_env",
                SettingKind::String,
                false,
                "a variable (list it in `secrets`) holding that user's password",
            ),
            setting(
                "platform",
                SettingKind::String,
                false,
                "the platform copied out of a multi-platform image index (default `linux/amd64`)",
            ),
        ],
        validate: None,
    },
    BuiltinSpec {
        name: "freeze",
        version: 1,
        summary: "a checked, content-addressed freeze of the selected items, split by split",
        inputs: &[
            port(
                "selection",
                "a JSON array or JSONL file of the selected items, each with an ID and a split",
            ),
            port(
                "items",
                "a directory with one subdirectory per item, named by its ID",
            ),
        ],
        open_inputs: false,
        outputs: &[port(
            "freeze",
            "the freeze directory: manifest.json, SHA256SUMS and items/ID/",
        )],
        settings: &[
            setting("name", Name, true, "the dataset's name"),
            setting("version", Name, true, "the dataset's version"),
            setting(
                "id",
                SettingKind::String,
                false,
                "the field that holds an item's ID (default `id`)",
            ),
            setting(
                "split",
                SettingKind::String,
                false,
                "the field that holds an item's split (default `split`)",
            ),
            setting(
                "group",
                SettingKind::String,
                false,
                "the field that groups items (e.g. `repo`) for the group checks",
            ),
            setting(
                "sizes",
                Counts,
                false,
                "the exact number of items each split must have; no other split may appear",
            ),
            setting(
                "disjoint_groups",
                Bool,
                false,
                "no group may have items in two splits (default true when `group` is set)",
            ),
            setting(
                "max_per_group",
                Count,
                false,
                "at most this many items per group",
            ),
            setting("require", Strings, false, "IDs that must be in the freeze"),
            setting(
                "content_version",
                Bool,
                false,
                "append the first 12 hex digits of the content's SHA-256 to `version`, so a changed freeze is a new version",
            ),
        ],
        validate: None,
    },
    BuiltinSpec {
        name: "lineage",
        version: 1,
        summary: "each frozen item's chain of items, from the ledger, for a bundle that is traced without it",
        inputs: &[port(
            "freeze",
            "a freeze directory written by `uses = \"freeze\"`",
        )],
        open_inputs: false,
        outputs: &[port(
            "lineage",
            "JSON: per frozen ID, the items behind it (as `cairn provenance` shows them, without times)",
        )],
        settings: &[],
        validate: None,
    },
    BuiltinSpec {
        name: "export",
        version: 1,
        summary: "a reproducible tar + zstd bundle of a freeze, with its SHA-256 and an in-toto attestation inside",
        inputs: &[
            port(
                "freeze",
                "a freeze directory written by `uses = \"freeze\"`",
            ),
            optional_port(
                "lineage",
                "each item's chain, written by `uses = \"lineage\"`: carried in the attestation",
            ),
        ],
        open_inputs: false,
        outputs: &[
            port("bundle", "the archive (`.tar.zst`)"),
            port("sha256", "the archive's SHA-256, in `sha256sum` format"),
        ],
        settings: &[setting(
            "level",
            Level,
            false,
            "the zstd compression level, 1 to 19 (default 3)",
        )],
        validate: None,
    },
    BuiltinSpec {
        name: "register",
        version: 1,
        summary: "verify a bundle, then import it into a registry directory",
        inputs: &[
            port("bundle", "an archive written by `uses = \"export\"`"),
            port(
                "sha256",
                "the archive's expected SHA-256, in `sha256sum` format",
            ),
        ],
        open_inputs: false,
        outputs: &[port(
            "receipt",
            "a JSON receipt: name, version, digests and where it was registered",
        )],
        settings: &[setting(
            "into",
            SettingKind::String,
            true,
            "the registry directory (relative to the project root, or absolute)",
        )],
        validate: None,
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
