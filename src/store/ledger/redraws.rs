//! The `redraws` table: each `cairn resample`, the samples of a sampled
//! stage it draws anew. A sample's draw is how many records name it.

use super::*;

/// Which samples a `cairn resample` draws anew: all of a stage's, an
/// item's, or one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redraw {
    pub stage: String,
    pub item: Option<String>,
    pub sample: Option<u32>,
}

/// The draws recorded for a stage's samples, to count per sample.
#[derive(Debug, Default)]
pub struct Draws {
    /// Records naming every item (and sample `None`) or every item's sample.
    all: Vec<Option<u32>>,
    by_item: HashMap<String, Vec<Option<u32>>>,
}

impl Draws {
    /// How many times sample `index` of item `key` was drawn anew.
    pub fn of(&self, key: &str, index: u32) -> u32 {
        let counted = |records: &[Option<u32>]| {
            records
                .iter()
                .filter(|s| s.is_none_or(|s| s == index))
                .count() as u32
        };
        counted(&self.all) + self.by_item.get(key).map_or(0, |r| counted(r))
    }
}

impl Ledger {
    /// Records that `redraw` is drawn anew from now on.
    pub fn record_redraw(&self, redraw: &Redraw) -> Result<(), StoreError> {
        self.conn
            .execute(
                "INSERT INTO redraws (pipeline, stage, item, sample, at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    self.pipeline.name,
                    redraw.stage,
                    redraw.item,
                    redraw.sample,
                    now_ms()
                ],
            )
            .map_err(|e| self.db(e))?;
        Ok(())
    }

    /// The draws recorded for `stage`'s samples.
    pub fn draws(&self, stage: &str) -> Result<Draws, StoreError> {
        let mut statement = self
            .conn
            .prepare_cached("SELECT item, sample FROM redraws WHERE pipeline = ?1 AND stage = ?2")
            .map_err(|e| self.db(e))?;
        let rows = statement
            .query_map(params![self.pipeline.name, stage], |row| {
                Ok((
                    row.get::<_, Option<String>>(0)?,
                    row.get::<_, Option<u32>>(1)?,
                ))
            })
            .map_err(|e| self.db(e))?;
        let mut draws = Draws::default();
        for row in rows {
            match row.map_err(|e| self.db(e))? {
                (None, sample) => draws.all.push(sample),
                (Some(item), sample) => draws.by_item.entry(item).or_default().push(sample),
            }
        }
        Ok(draws)
    }
}
