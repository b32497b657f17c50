//! `kind = "kubernetes"` executors: the namespace, image and placement of
//! the Jobs a stage's commands become.

use std::collections::BTreeMap;
use std::time::Duration;

use super::super::ImageRef;
use super::super::model::{KubernetesSettings, RootVolume, Toleration, is_per_item};
use super::super::raw::{Entry, Node, NodeKind};
use super::{Checker, find};
use crate::manifest::error::Problem;

pub(super) const KEYS: &[&str] = &[
    "kind",
    "namespace",
    "image",
    "require_digest",
    "service_account",
    "cpu",
    "memory",
    "gpus",
    "node_selector",
    "tolerations",
    "image_pull_secrets",
    "secret",
    "claim",
    "host_path",
    "unschedulable_timeout",
    "ttl",
    "max_jobs",
    "batch",
    "qps",
];
const TOLERATION_KEYS: &[&str] = &["key", "operator", "value", "effect"];
/// How long a pod may wait for a node, unless `unschedulable_timeout` says.
const DEFAULT_UNSCHEDULABLE: Duration = Duration::from_secs(300);
/// How long a finished Job stays, unless `ttl` says.
const DEFAULT_TTL: Duration = Duration::from_secs(3600);
/// Unfinished Jobs at once on one executor, unless `max_jobs` says.
const DEFAULT_MAX_JOBS: usize = 256;

impl Checker<'_> {
    pub(super) fn kubernetes_settings(
        &mut self,
        name: &str,
        node: &Node,
        table: &[Entry],
    ) -> Option<KubernetesSettings> {
        let text = |checker: &mut Self, key: &str| {
            find(table, key).and_then(|e| checker.string(&e.value, &format!("`{key}`")))
        };
        let flag = |checker: &mut Self, key: &str| {
            find(table, key).and_then(|e| match e.value.kind {
                NodeKind::Boolean(b) => Some(b),
                _ => {
                    checker.type_error(&e.value, &format!("`{key}`"), "true or false");
                    None
                }
            })
        };
        let require_digest = flag(self, "require_digest").unwrap_or(true);
        let image = match find(table, "image") {
            None => {
                self.problems.push(
                    Problem::new(
                        format!("kubernetes executor `{name}` has no `image`"),
                        node.span.clone(),
                        "here",
                    )
                    .help("name the image its pods run, by digest: `image = \"REPO@sha256:…\"`"),
                );
                None
            }
            Some(entry) => {
                let image = self.string(&entry.value, "`image`")?;
                let per_item = is_per_item(&image);
                let parsed = ImageRef::parse(&image);
                if per_item {
                    // Each item's image is pinned (or refused) when the
                    // item is fingerprinted.
                } else if let Err(why) = &parsed {
                    self.problems.push(
                        Problem::new(
                            format!("executor `{name}`: {why}"),
                            entry.value.span.clone(),
                            "here",
                        )
                        .help("write `HOST/REPO@sha256:<digest>`, or `{item.FIELD}` for each item's own image"),
                    );
                } else if require_digest && parsed.is_ok_and(|r| r.digest.is_none()) {
                    self.problems.push(
                        Problem::new(
                            format!("image `{image}` of executor `{name}` is not given by digest"),
                            entry.value.span.clone(),
                            "a tag can move",
                        )
                        .help("write `REPO@sha256:<digest>` (skopeo inspect shows it), or set `require_digest = false` to resolve the tag through its registry each time the stage is fingerprinted"),
                    );
                }
                Some(image)
            }
        };
        let root_volume = match (text(self, "claim"), flag(self, "host_path")) {
            (Some(claim), None | Some(false)) => Some(RootVolume::Claim(claim)),
            (None, Some(true)) => Some(RootVolume::HostPath),
            (claim, host_path) => {
                let (message, help) = if claim.is_some() && host_path == Some(true) {
                    (
                        "sets both `claim` and `host_path`",
                        "keep one: the root comes from one volume",
                    )
                } else {
                    (
                        "does not say how pods see the project root",
                        "pods must see the project root at its own path: name a PersistentVolumeClaim that holds it (`claim = \"NAME\"`) or, on one-node clusters and nodes that all mount it, `host_path = true`",
                    )
                };
                self.problems.push(
                    Problem::new(
                        format!("kubernetes executor `{name}` {message}"),
                        node.span.clone(),
                        "here",
                    )
                    .help(help),
                );
                None
            }
        };
        let gpus = find(table, "gpus")
            .and_then(|e| self.count(&e.value, "`gpus`", 1))
            .map(|n| n as u32);
        let qps = find(table, "qps")
            .and_then(|e| self.count(&e.value, "`qps`", 1))
            .map(|n| n as u32);
        let batch = find(table, "batch")
            .and_then(|e| self.count(&e.value, "`batch`", 1))
            .unwrap_or(1);
        let max_jobs = find(table, "max_jobs")
            .and_then(|e| self.count(&e.value, "`max_jobs`", 1))
            .unwrap_or(DEFAULT_MAX_JOBS);
        let settings = KubernetesSettings {
            namespace: text(self, "namespace").unwrap_or_else(|| "default".to_owned()),
            image: image.clone().unwrap_or_default(),
            require_digest,
            service_account: text(self, "service_account"),
            cpu: text(self, "cpu"),
            memory: text(self, "memory"),
            gpus,
            node_selector: self.string_map(table, "node_selector"),
            tolerations: self.tolerations(table),
            image_pull_secrets: self.strings(table, "image_pull_secrets"),
            secret: text(self, "secret"),
            root_volume: root_volume.clone().unwrap_or_default(),
            unschedulable_timeout: find(table, "unschedulable_timeout")
                .and_then(|e| self.timeout(&e.value))
                .unwrap_or(DEFAULT_UNSCHEDULABLE),
            ttl: find(table, "ttl")
                .and_then(|e| self.timeout(&e.value))
                .unwrap_or(DEFAULT_TTL),
            max_jobs,
            batch,
            qps,
        };
        (image.is_some() && root_volume.is_some()).then_some(settings)
    }

    fn strings(&mut self, table: &[Entry], key: &str) -> Vec<String> {
        match find(table, key) {
            None => Vec::new(),
            Some(e) => match e.value.as_array() {
                Some(items) => items
                    .iter()
                    .filter_map(|item| self.string(item, &format!("a `{key}` entry")))
                    .collect(),
                None => {
                    self.type_error(&e.value, &format!("`{key}`"), "an array of strings");
                    Vec::new()
                }
            },
        }
    }

    fn string_map(&mut self, table: &[Entry], key: &str) -> BTreeMap<String, String> {
        let Some(entry) = find(table, key) else {
            return BTreeMap::new();
        };
        let Some(entries) = self.expect_table(&entry.value, &format!("`{key}`")) else {
            return BTreeMap::new();
        };
        entries
            .iter()
            .filter_map(|e| {
                let value = self.string(&e.value, &format!("`{key}.{}`", e.key))?;
                Some((e.key.clone(), value))
            })
            .collect()
    }

    fn tolerations(&mut self, table: &[Entry]) -> Vec<Toleration> {
        let Some(entry) = find(table, "tolerations") else {
            return Vec::new();
        };
        let Some(items) = entry.value.as_array() else {
            self.type_error(&entry.value, "`tolerations`", "an array of tables");
            return Vec::new();
        };
        items
            .iter()
            .filter_map(|item| {
                let fields = self.expect_table(item, "a `tolerations` entry")?;
                self.unknown_keys(fields, TOLERATION_KEYS, "a toleration");
                let mut field = |key: &str| {
                    find(fields, key).and_then(|e| self.string(&e.value, &format!("`{key}`")))
                };
                Some(Toleration {
                    key: field("key"),
                    operator: field("operator"),
                    value: field("value"),
                    effect: field("effect"),
                })
            })
            .collect()
    }
}
