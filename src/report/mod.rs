//! The run report: what `cairn report` gathers from the ledger (`data`)
//! and the self-contained HTML page it draws (`html`, with the charts in
//! `svg` and the DAG's layout in `layout`).

pub mod palette;
