//! The sample plan: which global sample index comes out at each output position.
//!
//! A pure, cheap state machine (index arithmetic only, no I/O), so the stream is a function of
//! (shard sizes, config, seed, position) and nothing else:
//! - per epoch the shard order is a permutation drawn from (seed, epoch);
//! - `interleave` shards are open at once and read round-robin, rows in order inside a shard
//!   (sequential I/O); an exhausted shard is replaced in place by the next one in the order;
//! - a shuffle buffer of `buffer_size` slots holds sample *indices*; output position `p` takes
//!   slot `hash(seed, p) mod len` and refills it from the source. Drawing starts once the buffer
//!   holds `buffer_initial` items; until it is full each draw reads two items (one refills the
//!   slot, one grows the buffer), as webdataset's `shuffle(bufsize, initial)` does.
//!
//! The whole state is a few counters plus the buffer's indices, so it serialises to a small JSON
//! object and a planner rebuilt from it continues exactly where the old one was.
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::rng::{permutation, Purpose, Stream};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanConfig {
    pub seed: u64,
    /// Permute shards per epoch and draw from a shuffle buffer (train); else file order (eval).
    pub shuffle: bool,
    /// Start the next epoch when one ends (train) or stop (eval).
    pub repeat: bool,
    pub interleave: usize,
    pub buffer_size: usize,
    /// Items in the buffer before the first draw, in 1..=buffer_size (buffer_size: fill first).
    pub buffer_initial: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanState {
    /// Epoch the source is reading.
    pub epoch: u64,
    /// How many shards of this epoch's order have been opened.
    pub next_shard: usize,
    /// Open shards in round-robin order: [shard id, next row].
    pub open: Vec<[u64; 2]>,
    /// Which open shard gives the next source item.
    pub turn: usize,
    /// Output position of the next item.
    pub position: u64,
    /// Shuffle-buffer slots: [global index, epoch it was read in].
    pub buffer: Vec<[u64; 2]>,
}

impl PlanState {
    pub fn start() -> Self {
        Self { epoch: 0, next_shard: 0, open: Vec::new(), turn: 0, position: 0, buffer: Vec::new() }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanItem {
    pub position: u64,
    pub index: u64,
    pub epoch: u64,
}

#[derive(Clone)]
pub struct Planner {
    cfg: PlanConfig,
    rows: Arc<Vec<u64>>,
    offsets: Arc<Vec<u64>>,
    order: Vec<usize>,
    state: PlanState,
}

impl Planner {
    pub fn new(cfg: PlanConfig, shard_rows: &[u64], state: Option<PlanState>) -> Result<Self> {
        if cfg.interleave == 0 {
            return Err(Error::config("interleave must be >= 1"));
        }
        if cfg.buffer_size > 0 && !(1..=cfg.buffer_size).contains(&cfg.buffer_initial) {
            let msg = format!("shuffle_initial {} must be in 1..={}", cfg.buffer_initial, cfg.buffer_size);
            return Err(Error::config(msg));
        }
        let mut offsets = Vec::with_capacity(shard_rows.len());
        let mut total = 0u64;
        for &r in shard_rows {
            offsets.push(total);
            total += r;
        }
        let state = state.unwrap_or_else(PlanState::start);
        validate(&cfg, shard_rows, total, &state)?;
        let order = shard_order(&cfg, shard_rows.len(), state.epoch);
        Ok(Self { cfg, rows: Arc::new(shard_rows.to_vec()), offsets: Arc::new(offsets), order, state })
    }

    pub fn state(&self) -> &PlanState {
        &self.state
    }

    pub fn position(&self) -> u64 {
        self.state.position
    }

    /// Next (index, epoch) from the interleaved shard readers, moving to the next epoch if allowed.
    fn next_source(&mut self) -> Option<[u64; 2]> {
        loop {
            if self.state.open.is_empty() {
                while self.state.open.len() < self.cfg.interleave {
                    match self.take_next_shard() {
                        Some(s) => self.state.open.push([s as u64, 0]),
                        None => break,
                    }
                }
                if self.state.open.is_empty() {
                    if !self.cfg.repeat || self.offsets.is_empty() || self.rows.iter().all(|&r| r == 0) {
                        return None;
                    }
                    self.state.epoch += 1;
                    self.state.next_shard = 0;
                    self.state.turn = 0;
                    self.order = shard_order(&self.cfg, self.rows.len(), self.state.epoch);
                    continue;
                }
            }
            let t = self.state.turn % self.state.open.len();
            let [shard, row] = self.state.open[t];
            let item = [self.offsets[shard as usize] + row, self.state.epoch];
            if row + 1 < self.rows[shard as usize] {
                self.state.open[t][1] = row + 1;
                self.state.turn = (t + 1) % self.state.open.len();
            } else if let Some(s) = self.take_next_shard() {
                self.state.open[t] = [s as u64, 0];
                self.state.turn = (t + 1) % self.state.open.len();
            } else {
                // The shard after the removed one slides into slot t and is next in turn.
                self.state.open.remove(t);
                self.state.turn = if self.state.open.is_empty() { 0 } else { t % self.state.open.len() };
            }
            return Some(item);
        }
    }

    /// The next non-empty shard of this epoch's order.
    fn take_next_shard(&mut self) -> Option<usize> {
        while self.state.next_shard < self.order.len() {
            let s = self.order[self.state.next_shard];
            self.state.next_shard += 1;
            if self.rows[s] > 0 {
                return Some(s);
            }
        }
        None
    }
}

impl Iterator for Planner {
    type Item = PlanItem;

    fn next(&mut self) -> Option<PlanItem> {
        let (index, epoch) = if self.cfg.shuffle && self.cfg.buffer_size > 0 {
            while self.state.buffer.len() < self.cfg.buffer_initial {
                match self.next_source() {
                    Some(item) => self.state.buffer.push(item),
                    None => break,
                }
            }
            if self.state.buffer.is_empty() {
                return None;
            }
            let len = self.state.buffer.len() as u64;
            let slot = Stream::new(&[self.cfg.seed, Purpose::BufferPick as u64, self.state.position]).below(len) as usize;
            let [index, epoch] = self.state.buffer[slot];
            match self.next_source() {
                Some(refill) => self.state.buffer[slot] = refill,
                None => {
                    self.state.buffer.swap_remove(slot);
                }
            }
            if self.state.buffer.len() < self.cfg.buffer_size {
                if let Some(grow) = self.next_source() {
                    self.state.buffer.push(grow);
                }
            }
            (index, epoch)
        } else {
            let [index, epoch] = self.next_source()?;
            (index, epoch)
        };
        let item = PlanItem { position: self.state.position, index, epoch };
        self.state.position += 1;
        Some(item)
    }
}

fn shard_order(cfg: &PlanConfig, n: usize, epoch: u64) -> Vec<usize> {
    if cfg.shuffle {
        permutation(n, &[cfg.seed, Purpose::ShardOrder as u64, epoch])
    } else {
        (0..n).collect()
    }
}

fn validate(cfg: &PlanConfig, rows: &[u64], total: u64, st: &PlanState) -> Result<()> {
    let bad = |what: String| Err(Error::state(format!("loader state does not fit this data set: {what}")));
    if st.next_shard > rows.len() {
        return bad(format!("next_shard {} > {} shards", st.next_shard, rows.len()));
    }
    if st.open.len() > cfg.interleave {
        return bad(format!("{} open shards > interleave {}", st.open.len(), cfg.interleave));
    }
    for &[s, r] in &st.open {
        if s as usize >= rows.len() || r >= rows[s as usize] {
            return bad(format!("open shard {s} at row {r} is out of range"));
        }
    }
    if st.buffer.len() > cfg.buffer_size {
        return bad(format!("{} buffered samples > shuffle_buffer {}", st.buffer.len(), cfg.buffer_size));
    }
    if let Some([i, _]) = st.buffer.iter().find(|[i, _]| *i >= total) {
        return bad(format!("buffered sample index {i} >= {total} samples"));
    }
    // What an edited or damaged state held, accepted: a position near 2^64 (the window's end wrapped
    // around: a hang), a shard open twice (its rows read twice an epoch), epochs never reached.
    let mut open: Vec<u64> = st.open.iter().map(|[s, _]| *s).collect();
    open.sort_unstable();
    if let Some(w) = open.windows(2).find(|w| w[0] == w[1]) {
        return bad(format!("shard {} is open twice", w[0]));
    }
    if let Some([i, e]) = st.buffer.iter().find(|[_, e]| *e > st.epoch) {
        return bad(format!("buffered sample {i} of epoch {e}, past the state's epoch {}", st.epoch));
    }
    if !cfg.repeat && st.epoch > 0 {
        return bad(format!("epoch {} of a single pass", st.epoch));
    }
    // Read so far: the epochs before this one whole, and the items handed out or buffered.
    let read = st.position.checked_add(st.buffer.len() as u64);
    let whole = st.epoch.checked_mul(total);
    let at_most = st.epoch.checked_add(1).and_then(|e| e.checked_mul(total));
    if !matches!((read, whole, at_most), (Some(r), Some(w), Some(m)) if w <= r && r <= m) {
        let buffered = st.buffer.len();
        return bad(format!("position {} and {buffered} buffered do not fit epoch {} of {total} samples", st.position, st.epoch));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(shuffle: bool, repeat: bool, interleave: usize, buffer_size: usize) -> PlanConfig {
        PlanConfig { seed: 7, shuffle, repeat, interleave, buffer_size, buffer_initial: buffer_size }
    }

    fn take(p: &mut Planner, n: usize) -> Vec<PlanItem> {
        (0..n).map_while(|_| p.next()).collect()
    }

    #[test]
    fn eval_order_is_file_order_and_finite() {
        let mut p = Planner::new(cfg(false, false, 1, 0), &[3, 0, 2], None).unwrap();
        let idx: Vec<u64> = take(&mut p, 10).iter().map(|i| i.index).collect();
        assert_eq!(idx, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn round_robin_interleaves_shards_in_row_order() {
        let mut p = Planner::new(cfg(false, false, 2, 0), &[3, 2, 2], None).unwrap();
        let idx: Vec<u64> = take(&mut p, 10).iter().map(|i| i.index).collect();
        // shard 0 = 0..3, shard 1 = 3..5, shard 2 = 5..7; shard 2 replaces shard 1 in its slot.
        assert_eq!(idx, vec![0, 3, 1, 4, 2, 5, 6]);
    }

    #[test]
    fn every_epoch_covers_every_sample_once() {
        let rows = [5, 9, 1, 0, 7, 4];
        let total: u64 = rows.iter().sum();
        let mut p = Planner::new(cfg(true, true, 3, 8), &rows, None).unwrap();
        let items = take(&mut p, 200);
        // The source side (before the buffer) reads each epoch exactly once; count by epoch tag.
        for epoch in 0..4 {
            let mut seen: Vec<u64> = items.iter().filter(|i| i.epoch == epoch).map(|i| i.index).collect();
            seen.sort();
            assert_eq!(seen, (0..total).collect::<Vec<_>>(), "epoch {epoch}");
        }
    }

    #[test]
    fn restoring_state_continues_identically_at_every_position() {
        let rows = [5, 9, 1, 7, 4];
        let c = cfg(true, true, 2, 6);
        let mut straight = Planner::new(c.clone(), &rows, None).unwrap();
        let reference = take(&mut straight, 120);
        let mut p = Planner::new(c.clone(), &rows, None).unwrap();
        for k in 0..60 {
            let json = serde_json::to_string(p.state()).unwrap();
            let st: PlanState = serde_json::from_str(&json).unwrap();
            let mut resumed = Planner::new(c.clone(), &rows, Some(st)).unwrap();
            assert_eq!(take(&mut resumed, 40), reference[k..k + 40].to_vec(), "resume at {k}");
            p.next();
        }
    }

    #[test]
    fn a_warming_buffer_draws_early_grows_by_one_per_draw_and_resumes_exactly() {
        let rows = [5, 9, 1, 7, 4, 6];
        let total: u64 = rows.iter().sum();
        let c = PlanConfig { buffer_initial: 3, ..cfg(true, true, 1, 10) };
        let mut p = Planner::new(c.clone(), &rows, None).unwrap();
        // With one shard open, the source's first three items are rows 0..3 of the first shard.
        let first_shard = shard_order(&c, rows.len(), 0)[0];
        let offset: u64 = rows[..first_shard].iter().sum();
        let first = p.next().unwrap();
        assert!((offset..offset + 3).contains(&first.index), "{first:?} not among the first 3 read");
        for drawn in 1..=7 {
            assert_eq!(p.state().buffer.len(), (3 + drawn).min(10), "after {drawn} draws");
            p.next();
        }
        let reference = take(&mut Planner::new(c.clone(), &rows, None).unwrap(), 150);
        for epoch in 0..2 {
            let mut seen: Vec<u64> = reference.iter().filter(|i| i.epoch == epoch).map(|i| i.index).collect();
            seen.sort();
            assert_eq!(seen, (0..total).collect::<Vec<_>>(), "epoch {epoch}");
        }
        let mut p = Planner::new(c.clone(), &rows, None).unwrap();
        for k in 0..20 {
            let st = p.state().clone();
            assert_eq!(take(&mut Planner::new(c.clone(), &rows, Some(st)).unwrap(), 40), reference[k..k + 40]);
            p.next();
        }
        let bad = PlanConfig { buffer_initial: 11, ..c };
        assert!(Planner::new(bad, &rows, None).err().unwrap().message.contains("shuffle_initial 11"));
    }

    #[test]
    fn seeds_change_the_order() {
        let rows = [50, 50];
        let a: Vec<u64> = take(&mut Planner::new(cfg(true, true, 2, 16), &rows, None).unwrap(), 50).iter().map(|i| i.index).collect();
        let mut c2 = cfg(true, true, 2, 16);
        c2.seed = 8;
        let b: Vec<u64> = take(&mut Planner::new(c2, &rows, None).unwrap(), 50).iter().map(|i| i.index).collect();
        assert_ne!(a, b);
    }

    #[test]
    fn a_state_from_other_data_is_rejected() {
        let mut p = Planner::new(cfg(true, true, 2, 4), &[10, 10], None).unwrap();
        take(&mut p, 5);
        let err = Planner::new(cfg(true, true, 2, 4), &[3, 3], Some(p.state().clone())).err().unwrap();
        assert!(err.message.contains("does not fit"), "{}", err.message);
    }

    #[test]
    fn an_edited_state_is_rejected_and_every_state_the_planner_reaches_is_not() {
        let c = cfg(true, true, 2, 4);
        let mut p = Planner::new(c.clone(), &[3, 3], None).unwrap();
        for _ in 0..40 {
            Planner::new(c.clone(), &[3, 3], Some(p.state().clone())).unwrap(); // epochs 0..6, every position
            take(&mut p, 1);
        }
        let st = p.state().clone();
        for (edited, said) in [
            (PlanState { position: u64::MAX - 2, ..st.clone() }, "do not fit epoch"), // the loader hung
            (PlanState { epoch: u64::MAX, ..st.clone() }, "do not fit epoch"),
            (PlanState { open: vec![[0, 0], [0, 1]], ..st.clone() }, "shard 0 is open twice"),
            (PlanState { buffer: vec![[0, st.epoch + 1]], ..st.clone() }, "past the state's epoch"),
        ] {
            let err = Planner::new(c.clone(), &[3, 3], Some(edited)).err().unwrap();
            assert!(err.message.contains(said), "{said}: {}", err.message);
        }
        let single = cfg(false, false, 1, 0);
        let err = Planner::new(single, &[3, 3], Some(PlanState { epoch: 1, ..PlanState::start() })).err().unwrap();
        assert!(err.message.contains("epoch 1 of a single pass"), "{}", err.message);
    }
}
