"""The synthetic data sets, in a room of their own beside `birdjepa.data` (which reads any set): the
synthetic bird song behind `birdjepa demo-data` (generator version 2): invented species, their songs,
how each recording was recorded and how it was stored, all drawn deterministically from a seed.

The song's modules, one job each; each imports only the ones listed before it:

- `config`: `DemoConfig` (species count, sizes, seed), `RecordingPlan` (one recording to render) and
  the seeded draws (`rng_for`, `largest_remainder`, `stratified`);
- `songs`: the species table (band groups, notes, temporal patterns) and song rendering;
- `channel`: how each recording was recorded (`Nuisance`: noise, rumble, clicks, background species,
  microphone, level) and `render_recording`;
- `codecs`: the source formats (codec, sample-rate and channel mixes, `draw_formats`) and
  deterministic encoding (`encode_audio`);
- `writer`: rendering and encoding in worker processes, and what every set writes alike (a fresh
  folder, the manifest's species and nuisance tables).

The sets built on it: the demo set (`demo`), the scale set (`scale_set`) and the BirdSet stand-in
(`birdset_standin`); `demo_data` is their command line and `loader_demo` the loader's tour of the demo
set. The song's modules import none of them.

Same config -> byte-identical files, whatever the number of worker processes: every recording draws
from its own generators seeded by (seed, split, species, index, purpose), and the encoded bytes are
made canonical (libsndfile puts a time-seeded serial number in every Ogg page and a wall-clock
timestamp in the PEAK chunk of float WAVs; both are rewritten).
"""

GENERATOR = "birdjepa.demo_data"
"""Written into every manifest (the generator's name from before it moved into a package)."""
GENERATOR_VERSION = 2
"""Bump when the output changes: the demo set's cache folder is named after it (`ensure_demo_data`)."""
