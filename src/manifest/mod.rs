//! Pipeline manifests: TOML in, a validated [`Manifest`] out.
//!
//! `raw` turns TOML into spanned nodes, `load` validates them (every problem
//! at once, each located), `interpolate` resolves `{params.X}`, `{in.X}` and
//! `{out.X}` (through `shell`, which quotes each value for where it stands
//! in a shell command), and `model` holds the result.

pub mod catalog;
mod error;
mod image;
pub mod interpolate;
pub mod kept;
mod load;
mod model;
mod raw;
mod serde_as;
pub mod settings;
pub mod shell;

pub use error::{LoadError, ManifestErrors, Problem, line_col};
pub use image::{ImageRef, PinnedImage, sha256_digest};
pub use load::{SERVICE_GROUP, SERVICE_PORT, load, load_str};
pub use model::{
    ClassifyRule, Command, Compare, Ended, EnvValue, ErrorsCount, ExecutorSpec, Expect, Foreach,
    GpuNeed, Isolate, ItemClass, ItemOutput, KubernetesSettings, Link, Manifest, Named,
    OutputIndex, PathDecl, Pin, ProjectPath, RemoteCacheSpec, Resource, ResultCheck, Retry,
    RootVolume, Samples, Service, SlurmSettings, Stage, Toleration, Uses, is_per_item,
    lock_path_of,
};
pub use raw::Span;
