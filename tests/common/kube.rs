//! `scripts/kube-emulator`: a one-machine stand-in for a Kubernetes API
//! server and kubelet that the real binary reaches through the real kube
//! client (a kubeconfig), so Jobs are created, watched and deleted over
//! HTTP and their commands run as processes here.

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// An emulator serving on a free loopback port, stopped when dropped.
pub struct KubeEmulator {
    child: Child,
    state: tempfile::TempDir,
    pub kubeconfig: PathBuf,
}

impl KubeEmulator {
    /// `pullable`: the images its "registry" has (any other fails to
    /// pull); `None`: every image can be pulled.
    pub fn start(pullable: Option<&[String]>) -> KubeEmulator {
        super::require_tool("python3");
        let state = tempfile::tempdir().unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kube-emulator");
        let mut command = Command::new("python3");
        command
            .arg(script)
            .arg("serve")
            .arg(state.path().join("cluster"));
        if let Some(images) = pullable {
            let list = state.path().join("images.txt");
            std::fs::write(&list, images.join("\n")).unwrap();
            command.arg("--images").arg(list);
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start scripts/kube-emulator");
        // It prints its kubeconfig once it serves.
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let kubeconfig = PathBuf::from(
            line.trim()
                .strip_prefix("KUBECONFIG=")
                .unwrap_or_else(|| panic!("the emulator did not start: {line:?}")),
        );
        KubeEmulator {
            child,
            state,
            kubeconfig,
        }
    }

    fn records(&self, file: &str) -> Vec<Value> {
        std::fs::read_to_string(self.state.path().join("cluster").join(file))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Every Job created, in order: `{name, image, item, labels}` (`item`:
    /// the job's `CAIRN_ITEM`).
    pub fn jobs(&self) -> Vec<Value> {
        self.records("jobs.jsonl")
    }

    /// The names of the Jobs deleted, in order.
    pub fn deleted(&self) -> Vec<String> {
        self.records("deleted.jsonl")
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect()
    }

    /// The most Jobs unfinished at once, and how many are now.
    pub fn active(&self) -> (u64, u64) {
        let text = std::fs::read_to_string(self.state.path().join("cluster/stats.json")).unwrap();
        let stats: Value = serde_json::from_str(&text).unwrap();
        (
            stats["max_active"].as_u64().unwrap(),
            stats["active"].as_u64().unwrap(),
        )
    }
}

impl Drop for KubeEmulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
