//! The engines a run's stages execute on, one instance per `[executors]`
//! entry (so a remote engine's bound on jobs in flight covers every stage
//! that shares it), and this machine for everything else.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::exec::{Executor, KubernetesExecutor, LocalExecutor, SlurmExecutor};
use crate::manifest::{ExecutorSpec, Manifest};

pub struct Executors {
    /// Per stage index.
    by_stage: Vec<Arc<dyn Executor>>,
    /// By `[executors]` name.
    named: BTreeMap<String, Arc<dyn Executor>>,
}

impl Executors {
    pub fn of(manifest: &Manifest) -> Self {
        let local: Arc<dyn Executor> = Arc::new(LocalExecutor);
        let named: BTreeMap<&str, Arc<dyn Executor>> = manifest
            .executors
            .iter()
            .map(|(name, spec)| {
                let executor: Arc<dyn Executor> = match spec {
                    ExecutorSpec::Local => local.clone(),
                    ExecutorSpec::Slurm(settings) => Arc::new(SlurmExecutor::new(settings.clone())),
                    // Connects when its first job starts, so a manifest
                    // loads (and `status` works) without a cluster.
                    ExecutorSpec::Kubernetes(settings) => {
                        Arc::new(KubernetesExecutor::new(settings.clone()))
                    }
                };
                (name.as_str(), executor)
            })
            .collect();
        let by_stage = manifest
            .stages
            .iter()
            .map(|stage| {
                stage
                    .executor
                    .as_ref()
                    .and_then(|e| named.get(e.name.as_str()).cloned())
                    .unwrap_or_else(|| local.clone())
            })
            .collect();
        let named = named
            .into_iter()
            .map(|(name, executor)| (name.to_owned(), executor))
            .collect();
        Self { by_stage, named }
    }

    /// An executor of the engine a job handle names (`slurm:ID` → a Slurm
    /// executor, `kubernetes:NS/NAME` → a Kubernetes one, `pid:N` → this
    /// machine): what can cancel a job an earlier run left.
    pub fn for_handle(&self, handle: &str) -> Option<Arc<dyn Executor>> {
        // A local job's handle is its process id.
        let kind = if crate::exec::is_local_handle(handle) {
            "local"
        } else {
            handle.split(':').next()?
        };
        self.by_stage
            .iter()
            .chain(self.named.values())
            .find(|executor| executor.kind() == kind)
            .cloned()
    }

    /// The `[executors]` entry `name` (load checked every name it is given).
    pub fn named(&self, name: &str) -> Option<Arc<dyn Executor>> {
        self.named.get(name).cloned()
    }

    pub fn of_stage(&self, stage: usize) -> Arc<dyn Executor> {
        self.by_stage[stage].clone()
    }
}
