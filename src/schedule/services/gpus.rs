//! Whether this machine has the GPUs a service needs, asked of
//! `nvidia-smi` before the service is started.

use std::process::Stdio;

/// `Err` with what this machine has unless `nvidia-smi` shows at least
/// `need.count` GPUs with `need.memory_gib` GiB free each: a server that
/// cannot load its model is not started to find out.
pub(super) async fn gpus_free(need: &crate::manifest::GpuNeed) -> Result<(), String> {
    let wanted = format!(
        "needs {} GPU(s) with {} GiB free each",
        need.count, need.memory_gib
    );
    let output = tokio::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=index,name,memory.total,memory.used",
            "--format=csv,noheader,nounits",
        ])
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("{wanted}, and `nvidia-smi` cannot be run here: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{wanted}, and `nvidia-smi` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let gpus = parse_gpus(&String::from_utf8_lossy(&output.stdout));
    let fit = gpus
        .iter()
        .filter(|g| g.free_mib >= u64::from(need.memory_gib) * 1024)
        .count();
    if fit >= need.count as usize {
        return Ok(());
    }
    let shown: Vec<String> = gpus
        .iter()
        .map(|g| {
            format!(
                "GPU {} ({}, {:.1} GiB free of {:.1})",
                g.index,
                g.name,
                g.free_mib as f64 / 1024.0,
                g.total_mib as f64 / 1024.0
            )
        })
        .collect();
    Err(format!(
        "{wanted}; this machine has {fit} such: {}",
        if shown.is_empty() {
            "nvidia-smi lists no GPU".to_owned()
        } else {
            shown.join(", ")
        }
    ))
}

/// One GPU as `nvidia-smi` lists it.
#[derive(Debug, PartialEq)]
struct Gpu {
    index: String,
    name: String,
    total_mib: u64,
    free_mib: u64,
}

/// `nvidia-smi --query-gpu=index,name,memory.total,memory.used
/// --format=csv,noheader,nounits`, read (lines it cannot read are left
/// out).
fn parse_gpus(text: &str) -> Vec<Gpu> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let [index, name, total, used] = fields[..] else {
                return None;
            };
            let (total, used) = (total.parse::<u64>().ok()?, used.parse::<u64>().ok()?);
            Some(Gpu {
                index: index.to_owned(),
                name: name.to_owned(),
                total_mib: total,
                free_mib: total.saturating_sub(used),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_lines_are_read_and_the_free_memory_is_what_is_not_used() {
        let gpus = parse_gpus(
            "0, NVIDIA A100-SXM4-80GB, 81920, 1024\n1, NVIDIA A100-SXM4-80GB, 81920, 81000\nnot a line\n",
        );
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].free_mib, 80896);
        assert_eq!(gpus[1].free_mib, 920);
        assert_eq!(gpus[1].name, "NVIDIA A100-SXM4-80GB");
    }
}
