//! Where each stage goes in the report's DAG: a layered drawing, top-down.
//! A stage's layer is the length of the longest path to it; within a
//! layer, stages are ordered by the mean position of their upstream stages
//! (one barycentre pass), which keeps most edges short and uncrossed.

use std::collections::HashMap;

/// A stage's place: its layer (row) and its position in it (column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub layer: usize,
    pub column: usize,
}

/// Places `names` (in topological order) given each one's `upstream`.
pub fn layered(names: &[&str], upstream: &[Vec<&str>]) -> Vec<Place> {
    let index: HashMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let ups: Vec<Vec<usize>> = upstream
        .iter()
        .map(|ups| ups.iter().filter_map(|u| index.get(u).copied()).collect())
        .collect();
    let mut layer = vec![0usize; names.len()];
    for i in 0..names.len() {
        layer[i] = ups[i].iter().map(|&u| layer[u] + 1).max().unwrap_or(0);
    }
    let layers = layer.iter().max().map_or(0, |m| m + 1);
    let mut rows: Vec<Vec<usize>> = vec![Vec::new(); layers];
    for (i, &l) in layer.iter().enumerate() {
        rows[l].push(i);
    }
    let mut column = vec![0usize; names.len()];
    for row in &mut rows {
        // Upstream stages are in earlier rows, already placed.
        let centre = |i: usize| -> f64 {
            if ups[i].is_empty() {
                i as f64
            } else {
                ups[i].iter().map(|&u| column[u] as f64).sum::<f64>() / ups[i].len() as f64
            }
        };
        let mut keyed: Vec<(f64, usize)> = row.iter().map(|&i| (centre(i), i)).collect();
        keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        *row = keyed.into_iter().map(|(_, i)| i).collect();
        for (c, &i) in row.iter().enumerate() {
            column[i] = c;
        }
    }
    (0..names.len())
        .map(|i| Place {
            layer: layer[i],
            column: column[i],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_sits_below_every_stage_it_reads() {
        // a → b → d, a → c → d, e alone
        let names = ["a", "b", "c", "d", "e"];
        let upstream = vec![vec![], vec!["a"], vec!["a"], vec!["b", "c"], vec![]];
        let places = layered(&names, &upstream);
        assert_eq!(places[0].layer, 0);
        assert_eq!(places[1].layer, 1);
        assert_eq!(places[2].layer, 1);
        assert_eq!(places[3].layer, 2);
        assert_eq!(places[4].layer, 0);
        // Two stages of one layer never share a column.
        assert_ne!(places[1].column, places[2].column);
        assert_ne!(places[0].column, places[4].column);
    }

    #[test]
    fn a_longest_path_decides_the_layer() {
        // a → b → c, and a → c directly: c is below b.
        let names = ["a", "b", "c"];
        let upstream = vec![vec![], vec!["a"], vec!["a", "b"]];
        let places = layered(&names, &upstream);
        assert_eq!(
            places.iter().map(|p| p.layer).collect::<Vec<_>>(),
            [0, 1, 2]
        );
    }
}
