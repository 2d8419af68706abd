//! The loader: plan -> parallel decode -> reorder by position -> batches, with exact state.
//!
//! Workers take plan items (position, index, epoch) from a shared planner, decode them and send
//! the result tagged with its position. The consumer puts results back in position order, so
//! which worker finished first never matters: batch `k` holds the first `batch_size` decodable
//! positions after those of batch `k-1`, for any number of workers.
//!
//! State is taken from a *shadow* planner that the consumer advances one position per consumed
//! result; it therefore describes exactly "after the last batch handed out", however far the
//! workers have run ahead.
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::audio::{AudioError, ClipConfig, ClipExtractor, CropMode, SampleKey};
use crate::dataset::{ColumnConfig, Dataset, RecordError};
use crate::debug_hooks::DebugHooks;
use crate::error::{Error, ErrorKind, Result};
use crate::options::LoaderOptions;
use crate::plan::{PlanConfig, PlanItem, PlanState, Planner};
use crate::rng::hash_words;

const STATE_VERSION: u32 = 1;
/// How many skipped records `diagnostics()` lists (the count is exact regardless).
const SKIP_LOG_LIMIT: usize = 1000;

#[derive(Clone, Debug, PartialEq)]
pub struct LoaderConfig {
    pub batch_size: usize,
    pub n_workers: usize,
    pub n_views: usize,
    /// Train: infinite, shuffled, random crops (and masks if configured). Eval: one pass, in
    /// order, centre crops, no augmentation.
    pub train: bool,
    /// Train only: false turns crops into centre crops and masks off (debugging determinism).
    pub augment: bool,
    /// Eval only: drop the last batch if it is short.
    pub drop_last: bool,
    pub seed: u64,
    pub shuffle_buffer: usize,
    /// Train: start drawing once the buffer holds this many samples and grow it to `shuffle_buffer`
    /// by one per draw (webdataset's `initial`): an earlier first batch, but the first batches of a
    /// cold start come from few shards. None: fill the whole buffer first.
    pub shuffle_initial: Option<usize>,
    /// Shards read round-robin at once; None: all of them (batches then draw from every shard).
    pub interleave: Option<usize>,
    /// Decoded batches that may be in flight ahead of the consumer.
    pub prefetch_batches: usize,
    pub columns: ColumnConfig,
    pub clip: ClipConfig,
    /// Decode MP3 and Vorbis gapless (`LoaderOptions::gapless`).
    pub gapless: bool,
    /// The verification harness's seam: off unless a `debug_*` option asks.
    pub debug: DebugHooks,
}

/// The decode threads `n_workers` names: itself, or for 0 one per CPU this process may run on (its
/// affinity mask and cgroup quota: what a Slurm job's `--cpus-per-task` gives it). A worker that is ahead
/// of the consumer waits (the prefetch window bounds the clips in flight); on a GPU node the step needs
/// them all (docs/benchmarks.md: 16 workers gave 0.4x what an H200 consumes).
pub fn workers_for(n_workers: usize) -> usize {
    if n_workers > 0 {
        return n_workers;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_WORKERS))
}

/// The most decode threads a loader runs: 100000 panicked when the OS refused a thread, leaving the
/// ones started waiting for ever, and 2^63 overflowed a capacity.
pub const MAX_WORKERS: usize = 1024;

/// The shortest run of skips in a row after which a train pass gives up (`Loader::unreadable`).
const MIN_SKIPS_TO_GIVE_UP: u64 = 64;

impl Default for LoaderConfig {
    /// What the default [`LoaderOptions`] build: the defaults are written there only.
    fn default() -> Self {
        Self::from_options(&LoaderOptions::default())
    }
}

impl LoaderConfig {
    /// The loader these options name; the columns and the clip are built by the modules that own them.
    pub fn from_options(o: &LoaderOptions) -> Self {
        LoaderConfig {
            batch_size: o.batch_size,
            n_workers: workers_for(o.n_workers),
            n_views: o.n_views,
            train: o.train,
            augment: o.augment,
            drop_last: o.drop_last,
            seed: o.seed,
            shuffle_buffer: o.shuffle_buffer,
            shuffle_initial: o.shuffle_initial,
            interleave: o.interleave,
            prefetch_batches: o.prefetch_batches,
            columns: ColumnConfig::from_options(o),
            clip: ClipConfig::from_options(o),
            gapless: o.gapless,
            debug: DebugHooks::from_options(o),
        }
    }

    /// Every option in its range, checked without opening a file (a loader checks the same at its
    /// start), so a command line can be rejected before anything runs.
    /// Errs naming the first option out of its range; else the log-mel frames one clip gives (the
    /// first `n_frames` of them are kept) and its mel bands that no FFT bin falls in (the floor in
    /// every clip).
    pub fn check(&self) -> Result<(usize, usize)> {
        self.validate()?;
        let x = ClipExtractor::new(self.clip.clone()).map_err(Error::config)?;
        Ok((x.clip_frames(), x.empty_mel_bands()))
    }

    /// The buffer never holds more than one epoch: a larger one would hold several copies of a recording
    /// at once. (At one epoch or less, a recording not yet drawn meets the next epoch's copy of itself
    /// now and then, and a batch holds it twice, as in any shuffle buffer that streams across epochs.)
    fn plan_config(&self, shard_rows: &[u64]) -> PlanConfig {
        let n_samples: u64 = shard_rows.iter().sum();
        let buffer_size = if self.train { self.shuffle_buffer.min(n_samples as usize) } else { 0 };
        PlanConfig {
            seed: self.seed,
            shuffle: self.train,
            repeat: self.train,
            interleave: if self.train { self.interleave.unwrap_or(shard_rows.len()).max(1) } else { 1 },
            buffer_size,
            buffer_initial: self.shuffle_initial.map_or(buffer_size, |i| i.min(buffer_size)),
        }
    }

    /// The planner this config's loader runs over shards of `shard_rows` rows: the index stream
    /// without reading a file (for measuring how a setting mixes shards at a data set's scale).
    pub fn planner(&self, shard_rows: &[u64], state: Option<PlanState>) -> Result<Planner> {
        self.validate()?;
        Planner::new(self.plan_config(shard_rows), shard_rows, state)
    }

    /// How a record is cropped: its own window where it has one (eval mode reads windows only), else
    /// random or centred. A window that cannot be cut is the record's skip reason.
    fn crop_mode(
        &self,
        extractor: &ClipExtractor,
        window: Option<(f64, f64)>,
        events: Option<&[(f64, f64)]>,
    ) -> std::result::Result<CropMode, AudioError> {
        match (window, events) {
            (Some((start, end)), _) => extractor.window(start, end),
            (None, Some(events)) if self.train && self.augment => extractor.events(events),
            (None, _) if self.train && self.augment => Ok(CropMode::Random),
            (None, _) => Ok(CropMode::Center),
        }
    }

    /// Every option that shapes the batch stream, as printable values; `n_workers` and
    /// `prefetch_batches` are absent on purpose: they may change across a resume.
    pub fn stream_signature(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert("batch_size".into(), self.batch_size.to_string());
        m.insert("n_views".into(), self.n_views.to_string());
        m.insert("train".into(), self.train.to_string());
        m.insert("augment".into(), self.augment.to_string());
        m.insert("drop_last".into(), self.drop_last.to_string());
        m.insert("seed".into(), self.seed.to_string());
        m.insert("shuffle_buffer".into(), self.shuffle_buffer.to_string());
        m.insert("interleave".into(), self.interleave.map_or("all".into(), |k| k.to_string()));
        if let Some(initial) = self.shuffle_initial {
            // Only when set, so the signatures of states saved before the option existed still match.
            m.insert("shuffle_initial".into(), initial.to_string());
        }
        m.insert("audio_column".into(), self.columns.audio_column.clone());
        m.insert("label_column".into(), self.columns.label_column.clone());
        if let Some(names) = &self.columns.label_names {
            // Only when set, like `shuffle_initial`; the names as a count and a hash (they can be thousands).
            let words: Vec<u64> = names.iter().flat_map(|n| n.bytes().map(u64::from).chain([u64::MAX])).collect();
            m.insert("label_names".into(), format!("{} names #{:016x}", names.len(), hash_words(&words)));
        }
        // Multilabel and window options only where they change the stream, like `shuffle_initial`: states
        // saved without them still match.
        if let Some(column) = &self.columns.multilabel_column {
            m.insert("multilabel_column".into(), column.clone());
            m.insert("n_classes".into(), self.columns.n_classes.map_or("vocab".into(), |c| c.to_string()));
        }
        let defaults = LoaderOptions::default();
        if let Some((start, end)) = &self.columns.window_columns {
            if (start, end) != (&defaults.window_start_column, &defaults.window_end_column) {
                m.insert("window_start_column".into(), start.clone());
                m.insert("window_end_column".into(), end.clone());
            }
        }
        if let Some(column) = &self.columns.event_column {
            m.insert("event_column".into(), column.clone());
        }
        m.insert("clip".into(), format!("{:?}", self.clip));
        if self.gapless {
            // Only when on (the default since it exists), like `shuffle_initial`: a state saved before
            // it, whose run decodes as it did (read as off), still matches.
            m.insert("gapless".into(), "true".into());
        }
        self.debug.sign(&mut m);
        m
    }

    pub(crate) fn validate(&self) -> Result<()> {
        const MAX_PREFETCH: usize = 4096;
        const MAX_BATCH_VALUES: usize = 1 << 31;
        let check = |ok: bool, msg: &str| if ok { Ok(()) } else { Err(Error::config(msg)) };
        check(self.batch_size >= 1, "batch_size must be >= 1")?;
        check((1..=MAX_WORKERS).contains(&self.n_workers), "n_workers must be in 0..=1024 (0: one per CPU)")?;
        check(self.n_views >= 1, "n_views must be >= 1")?;
        check(self.interleave.is_none_or(|k| k >= 1), "interleave must be >= 1 (or None: all shards)")?;
        // Upper bounds: a batch of 2^40 rows aborted the process (its allocation failed), and a prefetch
        // of 2^63 batches wrapped the window's end around, a hang.
        check((1..=MAX_PREFETCH).contains(&self.prefetch_batches), "prefetch_batches must be in 1..=4096")?;
        let values = [self.n_views, self.clip.n_frames, self.clip.fbank.n_mels]
            .iter()
            .try_fold(self.batch_size, |a, &b| a.checked_mul(b))
            .filter(|&v| v <= MAX_BATCH_VALUES);
        check(values.is_some(), "batch_size x n_views x n_frames x n_mels must be at most 2^31 values a batch")?;
        check(!self.train || self.shuffle_buffer >= 1, "shuffle_buffer must be >= 1 in train mode")?;
        let initial_ok = self.shuffle_initial.is_none_or(|i| (1..=self.shuffle_buffer).contains(&i));
        check(initial_ok, "shuffle_initial must be in 1..=shuffle_buffer")?;
        self.debug.check()?;
        check(self.columns.n_classes != Some(0), "n_classes must be >= 1")?;
        let orphan = self.columns.n_classes.is_some() && self.columns.multilabel_column.is_none();
        check(!orphan, "n_classes is the width of multilabel_column's multi-hot: set multilabel_column too")?;
        // A root that is no folder (a typo, a node's local copy not made yet) was taken without a word:
        // every row naming its audio by path was then skipped, or none did and it was never read.
        match &self.columns.audio_root {
            Some(root) if !root.is_dir() => {
                Err(Error::config("audio_root must be a folder, where rows whose audio is a relative path find it"))
            }
            _ => Ok(()),
        }
    }
}

/// Counters that continue across a resume.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub batches: u64,
    pub samples: u64,
    pub skipped: u64,
}

/// Everything needed to continue the stream: JSON-able, small (counters + buffered indices).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    pub version: u32,
    pub fingerprint: String,
    pub n_samples: u64,
    pub stream: BTreeMap<String, String>,
    pub plan: PlanState,
    pub counters: Counters,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkippedRecord {
    pub index: u64,
    pub shard: usize,
    pub row: u64,
    pub file: String,
    pub epoch: u64,
    pub reason: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Diagnostics {
    pub fingerprint: String,
    pub n_samples: u64,
    pub n_shards: usize,
    pub counters: Counters,
    pub epoch: u64,
    pub position: u64,
    /// The most recent skipped records (at most SKIP_LOG_LIMIT), oldest first.
    pub skipped: Vec<SkippedRecord>,
}

/// A batch in row-major layout: spectrogram is [n, n_views, n_frames, n_mels] flattened, crop_offset
/// [n, n_views] flattened.
#[derive(Debug)]
pub struct Batch {
    pub n: usize,
    pub spectrogram: Vec<f32>,
    /// Each view's crop offset in output samples at the target rate (0 for a recording shorter than a
    /// clip; the centre crop's in eval mode, or the start of the row's own window).
    pub crop_offset: Vec<i64>,
    pub label: Vec<i64>,
    /// With a multilabel column: the `[n, n_classes]` multi-hot, flattened (0 or 1); else empty.
    pub multilabel: Vec<u8>,
    pub index: Vec<i64>,
    pub shard_id: Vec<i64>,
    pub epoch: Vec<i64>,
}

impl Batch {
    fn with_capacity(b: usize, n_views: usize, frame_len: usize) -> Self {
        Self {
            n: 0,
            spectrogram: Vec::with_capacity(b * n_views * frame_len),
            crop_offset: Vec::with_capacity(b * n_views),
            label: Vec::with_capacity(b),
            multilabel: Vec::new(),
            index: Vec::with_capacity(b),
            shard_id: Vec::with_capacity(b),
            epoch: Vec::with_capacity(b),
        }
    }
}

/// What `next_batch` returns when it does not error.
pub enum Poll {
    Batch(Batch),
    /// Eval mode: the pass is over.
    End,
    /// Nothing complete before the timeout; call again (lets the caller check for Ctrl-C).
    Pending,
}

struct Decoded {
    features: Vec<f32>,
    /// One per view.
    crop_offset: Vec<u64>,
    label: i64,
    multilabel: Option<Vec<u8>>,
    shard: usize,
}

enum Outcome {
    Sample(Decoded),
    Skip { shard: usize, row: u64, reason: String },
    Fatal(Error),
}

enum Message {
    Done { item: PlanItem, outcome: Outcome },
    /// The planner ran dry (eval): no position at or after this one exists.
    End { position: u64 },
}

struct Gate {
    planner: Planner,
    /// Workers may take positions below this (consumer position + window).
    limit: u64,
    exhausted: bool,
}

struct Shared {
    dataset: Arc<Dataset>,
    extractor: Arc<ClipExtractor>,
    cfg: LoaderConfig,
    gate: Mutex<Gate>,
    wake: Condvar,
    stop: AtomicBool,
    /// Feature buffers handed back by the consumer: reusing them saves a 256 KiB allocation, its
    /// page faults and zeroing per sample (`extract` overwrites every value).
    spare: Mutex<Vec<Vec<f32>>>,
}

/// Worker threads and their channel; dropping it stops and joins the threads.
struct Pipeline {
    shared: Arc<Shared>,
    rx: Receiver<Message>,
    workers: Vec<JoinHandle<()>>,
    /// The process the workers run in: a process forked from it has none of them.
    process: u32,
}

impl Pipeline {
    /// An error in a process forked from the one that spawned the workers: a batch was waited for there
    /// for ever, and dropping the loader panicked ("threads should not terminate unexpectedly").
    fn check_process(&self) -> Result<()> {
        let here = std::process::id();
        if here == self.process {
            return Ok(());
        }
        Err(Error::worker(format!(
            "this loader was opened in process {}, and this is {here}, forked from it, where its worker \
             threads are not: open a loader in this process (or start it with multiprocessing's 'spawn')",
            self.process
        )))
    }

    /// Tell the workers to stop and join them (idempotent); in a forked process, forget them.
    fn stop(&mut self) {
        if self.check_process().is_err() {
            std::mem::forget(std::mem::take(&mut self.workers));
            return;
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.stop();
    }
}

pub struct Loader {
    cfg: LoaderConfig,
    dataset: Arc<Dataset>,
    extractor: Arc<ClipExtractor>,
    /// The counters this loader was created with (an eval pass begun again starts from them).
    start_counters: Counters,
    pipeline: Pipeline,
    shadow: Planner,
    pending: BTreeMap<u64, Message>,
    end_at: Option<u64>,
    building: Batch,
    counters: Counters,
    committed: (PlanState, Counters),
    /// The state before the last batch handed out (what `put_back` returns to).
    before_last: (PlanState, Counters),
    /// A batch handed out and put back (`put_back`), with the state after it: the next one handed out.
    put_back: Option<(Batch, (PlanState, Counters))>,
    skipped: VecDeque<SkippedRecord>,
    /// Records skipped since the last one read, and which: a train pass that skips every record in a
    /// long enough run (`unreadable`) can read none, and would wait forever for its first batch.
    skips_in_a_row: u64,
    skipped_in_a_row: HashSet<u64>,
    failed: Option<Error>,
    finished: bool,
}

impl Loader {
    pub fn new(files: &[PathBuf], cfg: LoaderConfig, state: Option<LoaderState>) -> Result<Self> {
        let dataset = Arc::new(Self::open_dataset(files, &cfg)?);
        let extractor = ClipExtractor::new(cfg.clip.clone()).map_err(Error::config)?;
        let extractor = Arc::new(extractor.with_gapless(cfg.gapless));
        let (plan, counters) = match state {
            None => (PlanState::start(), Counters::default()),
            Some(st) => {
                check_state(&st, &dataset, &cfg)?;
                (st.plan, st.counters)
            }
        };
        let shadow = cfg.planner(&dataset.shard_rows(), Some(plan.clone()))?;
        let pipeline = spawn(&cfg, &dataset, &extractor, &shadow)?;
        Ok(Self {
            building: Batch::with_capacity(cfg.batch_size, cfg.n_views, extractor.frame_len()),
            cfg,
            dataset,
            extractor,
            start_counters: counters.clone(),
            pipeline,
            shadow,
            pending: BTreeMap::new(),
            end_at: None,
            counters: counters.clone(),
            before_last: (plan.clone(), counters.clone()),
            committed: (plan, counters),
            put_back: None,
            skipped: VecDeque::new(),
            skips_in_a_row: 0,
            skipped_in_a_row: HashSet::new(),
            failed: None,
            finished: false,
        })
    }

    /// What `new` opens before it starts a thread: the shards (their footers, schemas and columns),
    /// checked as the loader reads them. Its errors are `new`'s, without decoding a record.
    pub fn open_dataset(files: &[PathBuf], cfg: &LoaderConfig) -> Result<Dataset> {
        cfg.validate()?;
        let dataset = Dataset::open(files, cfg.columns.clone())?;
        if dataset.is_empty() {
            let first = dataset.shard_path(0).display();
            let more = if dataset.n_shards() > 1 { format!(" and {} more", dataset.n_shards() - 1) } else { String::new() };
            return Err(Error::data(format!("{first}{more}: no rows (every shard given is empty)")));
        }
        if !cfg.train && cfg.drop_last && dataset.len() < cfg.batch_size as u64 {  // every pass empty, unsaid
            return Err(Error::config(format!(
                "drop_last with batch_size {} drops every batch of a pass: the set holds {} rows",
                cfg.batch_size,
                dataset.len()
            )));
        }
        Ok(dataset)
    }

    pub fn config(&self) -> &LoaderConfig {
        &self.cfg
    }

    pub fn dataset(&self) -> &Dataset {
        &self.dataset
    }

    pub fn frame_shape(&self) -> (usize, usize) {
        (self.cfg.clip.n_frames, self.cfg.clip.fbank.n_mels)
    }

    /// Whether the current run of skips says no record can be read: every record failed in it, and it
    /// is long (`MIN_SKIPS_TO_GIVE_UP`, twice the data set). A run of an epoch's worth alone gave up on
    /// data of 3 good records in 10 (a run across an epoch's boundary), and on one recording whose crops
    /// fail only where it is damaged.
    fn unreadable(&self) -> bool {
        let n = self.dataset.len();
        self.skipped_in_a_row.len() as u64 == n && self.skips_in_a_row >= (2 * n).max(MIN_SKIPS_TO_GIVE_UP)
    }

    /// State after the last batch handed out.
    pub fn state(&self) -> LoaderState {
        LoaderState {
            version: STATE_VERSION,
            fingerprint: self.dataset.fingerprint().to_string(),
            n_samples: self.dataset.len(),
            stream: self.cfg.stream_signature(),
            plan: self.committed.0.clone(),
            counters: self.committed.1.clone(),
        }
    }

    pub fn diagnostics(&self) -> Diagnostics {
        Diagnostics {
            fingerprint: self.dataset.fingerprint().to_string(),
            n_samples: self.dataset.len(),
            n_shards: self.dataset.n_shards(),
            counters: self.committed.1.clone(),
            epoch: self.committed.0.epoch,
            position: self.committed.0.position,
            skipped: self.skipped.iter().cloned().collect(),
        }
    }

    /// Start a new pass from the data set's beginning (eval re-iteration), its counters those this loader
    /// was created with. From the state it was created with, a loader restored at a pass's end gave empty
    /// passes for ever.
    pub fn restart(&mut self) -> Result<()> {
        self.pipeline.check_process()?;
        let (plan, counters) = (PlanState::start(), self.start_counters.clone());
        self.shadow = self.cfg.planner(&self.dataset.shard_rows(), Some(plan.clone()))?;
        // Stop the old workers before starting new ones so the two never compete for cores.
        self.pipeline.stop();
        self.pipeline = spawn(&self.cfg, &self.dataset, &self.extractor, &self.shadow)?;
        self.pending.clear();
        self.end_at = None;
        self.building = Batch::with_capacity(self.cfg.batch_size, self.cfg.n_views, self.extractor.frame_len());
        self.counters = counters.clone();
        self.before_last = (plan.clone(), counters.clone());
        self.committed = (plan, counters);
        self.put_back = None;
        self.failed = None;
        self.skips_in_a_row = 0;
        self.skipped_in_a_row.clear();
        self.finished = false;
        Ok(())
    }

    /// The next batch, `End` after the last eval batch, or `Pending` if `timeout` passed first.
    pub fn next_batch(&mut self, timeout: Duration) -> Result<Poll> {
        self.pipeline.check_process()?;
        if let Some((batch, after)) = self.put_back.take() {
            self.committed = after;
            return Ok(Poll::Batch(batch));
        }
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.finished {
            return Ok(Poll::End);
        }
        let deadline = Instant::now() + timeout;
        loop {
            let position = self.shadow.position();
            if let Some(msg) = self.pending.remove(&position) {
                if let Err(e) = self.consume(msg) {
                    self.failed = Some(e.clone());
                    return Err(e);
                }
                if self.building.n == self.cfg.batch_size {
                    return Ok(Poll::Batch(self.finish_batch()));
                }
                continue;
            }
            if self.end_at.is_some_and(|end| end <= position) {
                self.finished = true;
                if self.building.n > 0 && !self.cfg.drop_last {
                    return Ok(Poll::Batch(self.finish_batch()));
                }
                // Skips after the last full batch still count.
                self.committed = (self.shadow.state().clone(), self.counters.clone());
                return Ok(Poll::End);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Poll::Pending);
            }
            match self.pipeline.rx.recv_timeout(deadline - now) {
                Ok(Message::End { position }) => self.end_at = Some(position),
                Ok(msg @ Message::Done { .. }) => {
                    let Message::Done { item, .. } = &msg else { unreachable!() };
                    self.pending.insert(item.position, msg);
                }
                Err(RecvTimeoutError::Timeout) => return Ok(Poll::Pending),
                Err(RecvTimeoutError::Disconnected) => {
                    let e = Error::worker("all loader workers exited without finishing the stream");
                    self.failed = Some(e.clone());
                    return Err(e);
                }
            }
        }
    }

    fn consume(&mut self, msg: Message) -> Result<()> {
        let Message::Done { item, outcome } = msg else { unreachable!("End is never stored") };
        let expected = self.shadow.next();
        if expected != Some(item) {
            return Err(Error::worker(format!("internal: result {item:?} arrived where the plan says {expected:?}")));
        }
        match outcome {
            Outcome::Sample(d) => {
                let b = &mut self.building;
                b.spectrogram.extend_from_slice(&d.features);
                b.crop_offset.extend(d.crop_offset.iter().map(|&o| o as i64));
                b.label.push(d.label);
                b.multilabel.extend(d.multilabel.iter().flatten());
                b.index.push(item.index as i64);
                b.shard_id.push(d.shard as i64);
                b.epoch.push(item.epoch as i64);
                b.n += 1;
                self.counters.samples += 1;
                self.skips_in_a_row = 0;
                self.skipped_in_a_row.clear();
                let mut spare = self.pipeline.shared.spare.lock().unwrap();
                if spare.len() < 2 * self.cfg.n_workers {
                    spare.push(d.features);
                }
            }
            Outcome::Skip { shard, row, reason } => {
                self.counters.skipped += 1;
                self.skips_in_a_row += 1;
                self.skipped_in_a_row.insert(item.index);
                if self.skipped.len() == SKIP_LOG_LIMIT {
                    self.skipped.pop_front();
                }
                let file = self.dataset.shard_path(shard).display().to_string();
                if self.cfg.train && self.unreadable() {
                    return Err(Error::data(format!(
                        "none of the {n} records can be read: each was skipped in a run of {k} skips in a row \
                         (the last: {file} row {row}: {reason})",
                        n = self.dataset.len(),
                        k = self.skips_in_a_row
                    )));
                }
                let epoch = item.epoch;
                self.skipped.push_back(SkippedRecord { index: item.index, shard, row, file, epoch, reason });
            }
            Outcome::Fatal(e) => return Err(e),
        }
        // Let workers run `window` positions past the consumer.
        let window = (self.cfg.prefetch_batches * self.cfg.batch_size).max(2 * self.cfg.n_workers) as u64;
        let mut gate = self.pipeline.shared.gate.lock().unwrap();
        gate.limit = self.shadow.position() + window;
        drop(gate);
        self.pipeline.shared.wake.notify_all();
        Ok(())
    }

    fn finish_batch(&mut self) -> Batch {
        let fresh = Batch::with_capacity(self.cfg.batch_size, self.cfg.n_views, self.extractor.frame_len());
        let batch = std::mem::replace(&mut self.building, fresh);
        self.counters.batches += 1;
        let after = (self.shadow.state().clone(), self.counters.clone());
        self.before_last = std::mem::replace(&mut self.committed, after);
        batch
    }

    /// Takes back `batch`, the last one handed out, which its caller never got (a Ctrl-C as it came):
    /// `state()` is the state before it again, and the next `next_batch` hands it out. A state saved on
    /// that Ctrl-C counted a batch no one trained on.
    pub fn put_back(&mut self, batch: Batch) {
        let after = std::mem::replace(&mut self.committed, self.before_last.clone());
        self.put_back = Some((batch, after));
    }
}

fn check_state(st: &LoaderState, dataset: &Dataset, cfg: &LoaderConfig) -> Result<()> {
    if st.version != STATE_VERSION {
        return Err(Error::state(format!("loader state version {} is not {STATE_VERSION}", st.version)));
    }
    if st.fingerprint != dataset.fingerprint() || st.n_samples != dataset.len() {
        return Err(Error::state(format!(
            "loader state was saved for other data: fingerprint {} with {} samples, but these {} shard(s) give fingerprint {} with {} samples",
            st.fingerprint,
            st.n_samples,
            dataset.n_shards(),
            dataset.fingerprint(),
            dataset.len()
        )));
    }
    let now = cfg.stream_signature();
    let keys: std::collections::BTreeSet<&String> = now.keys().chain(st.stream.keys()).collect();
    let diffs: Vec<String> = keys
        .into_iter()
        .filter(|k| now.get(*k) != st.stream.get(*k))
        .flat_map(|k| {
            let (saved, current) = (st.stream.get(k).map_or("(absent)", |v| v.as_str()), now.get(k).map_or("(absent)", |v| v.as_str()));
            // A struct's debug text (`clip`) whole on both sides was two 400-character lines to compare by eye.
            match (debug_fields(k, saved), debug_fields(k, current)) {
                (Some(a), Some(b)) if a.iter().map(|f| &f.0).eq(b.iter().map(|f| &f.0)) => a
                    .into_iter()
                    .zip(b)
                    .filter(|(x, y)| x.1 != y.1)
                    .map(|((name, x), (_, y))| format!("{name}: saved {x} now {y}"))
                    .collect(),
                _ => vec![format!("{k}: saved {saved} now {current}")],
            }
        })
        .collect();
    if !diffs.is_empty() {
        return Err(Error::state(format!(
            "loader state was saved with a different stream config: {}",
            diffs.join("; ")
        )));
    }
    Ok(())
}

/// The leaves of a struct's debug text (`Name { a: 1, b: Inner { c: 2 } }`) as `(prefix.a, 1)`,
/// `(prefix.b.c, 2)`; None where ``text`` is not one.
fn debug_fields(prefix: &str, text: &str) -> Option<Vec<(String, String)>> {
    let text = text.trim();
    let open = text.find(" { ")?;
    let inner = text[open + 3..].strip_suffix(" }")?;
    if !text[..open].chars().all(|c| c.is_alphanumeric() || c == '_') {
        return None;
    }
    let (mut fields, mut depth, mut start) = (Vec::new(), 0i32, 0);
    let mut parts = Vec::new();
    for (i, c) in inner.char_indices() {
        match c {
            '{' | '(' | '[' => depth += 1,
            '}' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    for part in parts {
        let (name, value) = part.trim().split_once(": ")?;
        let path = format!("{prefix}.{name}");
        match debug_fields(&path, value) {
            Some(leaves) => fields.extend(leaves),
            None => fields.push((path, value.trim().to_string())),
        }
    }
    Some(fields)
}

fn spawn(cfg: &LoaderConfig, dataset: &Arc<Dataset>, extractor: &Arc<ClipExtractor>, shadow: &Planner) -> Result<Pipeline> {
    let window = (cfg.prefetch_batches * cfg.batch_size).max(2 * cfg.n_workers) as u64;
    let shared = Arc::new(Shared {
        dataset: dataset.clone(),
        extractor: extractor.clone(),
        cfg: cfg.clone(),
        gate: Mutex::new(Gate { planner: shadow.clone(), limit: shadow.position() + window, exhausted: false }),
        wake: Condvar::new(),
        stop: AtomicBool::new(false),
        spare: Mutex::new(Vec::new()),
    });
    let (tx, rx) = channel();
    // A thread takes its name from inside itself once it runs: the loader returns only when every worker
    // runs under its name, so whoever lists the process's threads next (a profiler, a test) sees them all.
    let (ready_tx, ready_rx) = channel::<()>();
    let mut pipeline = Pipeline { shared, rx, workers: Vec::with_capacity(cfg.n_workers), process: std::process::id() };
    let mut failed = None;
    for w in 0..cfg.n_workers {
        let (shared, tx, ready) = (pipeline.shared.clone(), tx.clone(), ready_tx.clone());
        let started = std::thread::Builder::new().name(format!("birdjepa-loader-{w}")).spawn(move || {
            let _ = ready.send(());
            worker(&shared, &tx)
        });
        match started {
            Ok(handle) => pipeline.workers.push(handle),
            Err(e) => {
                failed = Some((w, e));
                break;
            }
        }
    }
    drop(ready_tx);
    for _ in 0..pipeline.workers.len() {
        let _ = ready_rx.recv();
    }
    // Out of threads (ulimit -u, a cgroup's pids.max): a Rust panic's traceback, the workers started
    // before it blocked for ever. Those stop as the pipeline drops.
    if let Some((w, e)) = failed {
        return Err(Error::limit(format!(
            "cannot start loader worker {w} of {}: {e}: a limit on this process's threads (ulimit -u, a \
             cgroup's pids.max); fewer n_workers",
            cfg.n_workers
        )));
    }
    Ok(pipeline)
}

fn worker(shared: &Shared, tx: &Sender<Message>) {
    loop {
        let item = {
            let mut gate = shared.gate.lock().unwrap();
            loop {
                if shared.stop.load(Ordering::SeqCst) || gate.exhausted {
                    return;
                }
                if gate.planner.position() < gate.limit {
                    break;
                }
                gate = shared.wake.wait(gate).unwrap();
            }
            match gate.planner.next() {
                Some(item) => item,
                None => {
                    gate.exhausted = true;
                    let position = gate.planner.position();
                    drop(gate);
                    shared.wake.notify_all();
                    let _ = tx.send(Message::End { position });
                    return;
                }
            }
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| process(shared, item))).unwrap_or_else(|panic| {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            let (shard, row) = shared.dataset.locate(item.index);
            Outcome::Fatal(Error {
                kind: ErrorKind::Worker,
                message: format!(
                    "loader worker panicked on sample {} ({} row {row}): {text}",
                    item.index,
                    shared.dataset.shard_path(shard).display()
                ),
            })
        });
        if tx.send(Message::Done { item, outcome }).is_err() {
            return;
        }
    }
}

fn process(shared: &Shared, item: PlanItem) -> Outcome {
    if shared.cfg.debug.panics_at(item.index) {
        panic!("debug_panic_index reached");
    }
    let (shard, row) = shared.dataset.locate(item.index);
    let record = match shared.dataset.record(item.index) {
        Ok(r) => r,
        Err(RecordError::Skip(reason)) => return Outcome::Skip { shard, row, reason },
        Err(RecordError::Fatal(e)) => return Outcome::Fatal(e),
    };
    let len = shared.cfg.n_views * shared.extractor.frame_len();
    let mut features = shared.spare.lock().unwrap().pop().unwrap_or_else(|| vec![0f32; len]);
    let key = SampleKey { seed: shared.cfg.seed, epoch: item.epoch, index: item.index };
    let shift = shared.cfg.debug.shifts_crop(item.index);
    let extracted = shared.cfg.crop_mode(&shared.extractor, record.window, record.events.as_deref()).and_then(|mode| {
        shared.extractor.extract(record.audio, mode, key, shared.cfg.n_views, shift, &mut features)
    });
    match extracted {
        Ok(crop_offset) => {
            let (label, multilabel) = (record.label, record.multilabel);
            Outcome::Sample(Decoded { features, crop_offset, label, multilabel, shard })
        }
        // A file read by path is named: the row alone sent a user through the shard for it.
        Err(AudioError(reason)) => match record.file {
            Some(file) => Outcome::Skip { shard, row, reason: format!("audio file {}: {reason}", file.display()) },
            None => Outcome::Skip { shard, row, reason },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audio::FbankConfig;

    /// Every default is written once, in `LoaderOptions`: each config defaults to what the default
    /// options build, and the options' `f64`s narrow exactly.
    #[test]
    fn every_config_defaults_to_what_the_default_options_build() {
        let d = LoaderOptions::default();
        let cfg = LoaderConfig::from_options(&d);
        assert_eq!(cfg, LoaderConfig::default());
        assert_eq!(cfg.columns, ColumnConfig::default());
        assert_eq!(cfg.clip, ClipConfig::default());
        assert_eq!(cfg.clip.fbank, FbankConfig::default());
        assert_eq!(cfg.clip.fbank.log_floor, f32::EPSILON);
        assert_eq!(cfg.clip.clip_samples, 160_000);
        let o = LoaderOptions::from_json(r#"{"batch_size": 4, "clip_seconds": 2.5}"#).unwrap();
        assert_eq!(ClipConfig::from_options(&o).clip_samples, 80_000);
    }

    #[test]
    fn the_crop_shift_is_off_by_default_and_in_the_stream_signature_only_when_on() {
        let off = LoaderConfig::default();
        assert_eq!(off.debug, DebugHooks::default());
        assert!(!off.stream_signature().contains_key("debug_crop_shift_index"));
        let on = LoaderConfig { debug: DebugHooks { crop_shift_index: 7, ..Default::default() }, ..off };
        assert_eq!(on.stream_signature()["debug_crop_shift_index"], "7");
    }

    #[test]
    fn multilabel_and_window_options_are_in_the_stream_signature_only_where_they_change_it() {
        let plain = LoaderConfig::default().stream_signature();
        let eval = LoaderConfig::from_options(&LoaderOptions { train: false, ..Default::default() });
        assert_eq!(eval.columns.window_columns, Some(("start_time".into(), "end_time".into())));
        for sig in [&plain, &eval.stream_signature()] {
            let new = |k: &String| ["multilabel", "n_classes", "window"].iter().any(|p| k.starts_with(p));
            assert!(!sig.keys().any(new), "{sig:?}");
        }
        let o = LoaderOptions { multilabel_column: Some("ebird_code_multilabel".into()), ..Default::default() };
        let sig = LoaderConfig::from_options(&o).stream_signature();
        assert_eq!((sig["multilabel_column"].as_str(), sig["n_classes"].as_str()), ("ebird_code_multilabel", "vocab"));
        let sig = LoaderConfig::from_options(&LoaderOptions { n_classes: Some(21), ..o }).stream_signature();
        assert_eq!(sig["n_classes"], "21");
        // Window columns are read in eval mode only: in train mode they change nothing.
        let renamed = LoaderOptions { window_start_column: "t0".into(), ..Default::default() };
        let train = LoaderConfig::from_options(&renamed);
        assert_eq!((train.columns.window_columns.clone(), train.stream_signature()), (None, plain));
        let sig = LoaderConfig::from_options(&LoaderOptions { train: false, ..renamed }).stream_signature();
        assert_eq!((sig["window_start_column"].as_str(), sig["window_end_column"].as_str()), ("t0", "end_time"));
    }

    #[test]
    fn check_names_the_first_option_out_of_range_and_passes_the_defaults() {
        assert_eq!(LoaderConfig::from_options(&LoaderOptions::default()).check().unwrap(), (498, 0)); // frames, empty mel bands
        // Each starts with the option's name, which the CLI turns into its flag (it named "need",
        // "clip_samples" and "time_mask.max_width"); a clip of 1e9 s aborted the process.
        for (json, name) in [
            (r#"{"f_max": 10.0}"#, "f_max (10 Hz) must be above f_min"),
            (r#"{"f_min": 20000.0}"#, "f_min (20000 Hz) must be in [0, f_max (16000 Hz))"),
            (r#"{"clip_seconds": 0.0}"#, "clip_seconds gives 0 samples, fewer than win_length"),
            (r#"{"clip_seconds": 1e9}"#, "clip_seconds gives 32000000000000 samples, more than 268435456"),
            (r#"{"batch_size": 1, "n_frames": 4194304}"#, "n_frames (4194304) x n_mels (128) is more than"),
            (r#"{"time_mask_count": 1, "time_mask_width": 600}"#, "time_mask_width (600) exceeds n_frames"),
            (r#"{"freq_mask_count": 2}"#, "freq_mask_width must be >= 1 where freq_mask_count is 2"),
            (r#"{"std": 0.0}"#, "std must be finite and > 0"),
            (r#"{"batch_size": 0}"#, "batch_size must be >= 1"),
            (r#"{"n_workers": 100000}"#, "n_workers must be in 0..=1024"),
            (r#"{"n_fft": 268435456}"#, "n_fft must be at most 65536"), // a hang, or an abort at 2^40
            (r#"{"n_mels": 600}"#, "n_mels (600) must be at most n_fft / 2 + 1 (513)"),
            (r#"{"time_mask_count": 1099511627776, "time_mask_width": 1}"#, "time_mask_count (1099511627776) exceeds n_frames"),
            (r#"{"freq_mask_count": 129, "freq_mask_width": 1}"#, "freq_mask_count (129) exceeds n_mels"),
            (r#"{"batch_size": 1099511627776}"#, "batch_size x n_views x n_frames x n_mels must be at most"),
            (r#"{"prefetch_batches": 9223372036854775807}"#, "prefetch_batches must be in 1..=4096"),
            (r#"{"shuffle_buffer": 8, "shuffle_initial": 9}"#, "shuffle_initial must be in"),
            (r#"{"hop_length": 0}"#, "hop_length must be > 0"),
            (r#"{"debug_crop_shift_index": -2}"#, "debug_crop_shift_index must be >= -1"),
            (r#"{"multilabel_column": "m", "n_classes": 0}"#, "n_classes must be >= 1"),
            (r#"{"n_classes": 3}"#, "set multilabel_column too"),
            (r#"{"audio_root": "/no/such/folder"}"#, "audio_root must be a folder, where rows whose audio"),
        ] {
            let e = LoaderConfig::from_options(&LoaderOptions::from_json(json).unwrap()).check().unwrap_err();
            assert_eq!(e.kind, ErrorKind::Config);
            assert!(e.message.contains(name), "{json}: {}", e.message);
        }
        let here = format!(r#"{{"audio_root": {:?}}}"#, env!("CARGO_MANIFEST_DIR"));
        assert!(LoaderConfig::from_options(&LoaderOptions::from_json(&here).unwrap()).check().is_ok());
    }
}
