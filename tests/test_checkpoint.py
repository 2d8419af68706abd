"""Checkpoints hold the whole training state, restore it bit-exactly and verify it.

Invariant 3 of docs/design.md.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from conftest import rewrite_meta

from birdjepa.rundir import checkpoint as ck
from birdjepa.rundir.checkpoint.norms import tree_norms

SRC = str(Path(__file__).resolve().parents[1] / "src")

# The realistic state, as source so the multi-device subprocesses build exactly the same one.
STATE_SRC = '''
import jax, jax.numpy as jnp, numpy as np, optax


def make_params(seed):
    rng = np.random.default_rng(seed)

    def w(*shape, dtype=np.float32):
        return jnp.asarray(rng.standard_normal(shape).astype(np.float32), dtype=dtype)

    return {
        "encoder": {
            "patch_embed": {"kernel": w(16, 32), "bias": w(32)},
            "block_0": {"attn": {"qkv": {"kernel": w(32, 96)}}, "norm": {"scale": w(32, dtype=jnp.bfloat16)}},
        },
        "projector": {"dense": {"kernel": w(32, 8)}},
        "probe": {"kernel": w(32, 5), "bias": w(5)},
    }


def make_opt():
    return optax.MultiSteps(optax.adamw(1e-3, weight_decay=0.05), every_k_schedule=2)


def make_state(seed=0, n_updates=3):
    """Params + MultiSteps(adamw) state after `n_updates` micro-steps + scalars."""
    params = make_params(seed)
    opt = make_opt()
    opt_state = opt.init(params)
    rng = np.random.default_rng(seed + 1)

    @jax.jit
    def micro_step(params, opt_state, grads):
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for _ in range(n_updates):
        grads = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape), p.dtype), params)
        params, opt_state = micro_step(params, opt_state, grads)
    key_data = np.asarray(jax.random.key_data(jax.random.key(seed)))
    return {"params": params, "opt_state": opt_state, "step": n_updates, "rng_key": key_data}


def make_target():
    """Freshly initialised objects of the same structure (what a resuming run has before restore)."""
    params = jax.tree.map(jnp.zeros_like, make_params(123))
    return {"params": params, "opt_state": make_opt().init(params), "step": 0,
            "rng_key": np.zeros(2, np.uint32)}
'''
_ns: dict = {}
exec(compile(STATE_SRC, "<state>", "exec"), _ns)
make_state = functools.cache(_ns["make_state"])  # jax arrays are immutable: sharing them is safe
make_target = _ns["make_target"]


def _run(script: str, env_extra: dict[str, str], *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **env_extra}
    env.setdefault("JAX_PLATFORMS", "cpu")
    proc = subprocess.run(
        [sys.executable, "-c", STATE_SRC + textwrap.dedent(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


# ------------------------------------------------------------------------------------------------ norms
def test_tree_norms_fixed_bits_and_groups():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 33)).astype(np.float32)
    tree = {"encoder": {"w": a, "b": np.arange(5, dtype=np.int32)}, "probe": {"w": a[:3]}}
    n = tree_norms(tree, "param_norm")
    assert list(n) == ["param_norm", "param_norm/encoder", "param_norm/probe"]
    expect_enc = np.sqrt(np.sum(a.astype(np.float64) ** 2) + 30.0)
    assert n["param_norm/encoder"] == pytest.approx(expect_enc, rel=1e-15)
    assert n["param_norm"] ** 2 == pytest.approx(n["param_norm/encoder"] ** 2 + n["param_norm/probe"] ** 2)
    # Same values in another memory layout / on a device -> the same bits.
    other = {"encoder": {"w": np.asfortranarray(a), "b": jnp.arange(5)}, "probe": {"w": jnp.asarray(a)[:3]}}
    assert tree_norms(other, "param_norm") == n
    # One flipped low bit in one float32 weight changes the float64 norm.
    b = a.copy()
    b.view(np.uint32)[10, 7] ^= 1
    assert (
        tree_norms({"encoder": {"w": b, "b": tree["encoder"]["b"]}, "probe": {"w": a[:3]}})["param_norm"]
        != n["param_norm"]
    )


def test_tree_norms_in_threads_give_the_bits_of_one_leaf_after_another():
    """Checkpoints record these norms and resumes compare them with ``==``: threads and the squares
    widened as they are computed must give the bits of the formula before them, every leaf widened to a
    float64 copy, squared and summed, the sums added in flatten order."""
    import math

    import ml_dtypes

    from birdjepa.rundir.checkpoint import norms

    rng = np.random.default_rng(3)
    big = rng.standard_normal((1200, 1000)).astype(np.float32) * 7  # past PARALLEL_ABOVE: threads
    tree = {
        "a": {"w": big, "t": big[:, :300].T, "b": jnp.asarray(rng.standard_normal(999), jnp.bfloat16)},
        "b": {"i": rng.integers(-9, 9, (333, 3)).astype(np.int32), "m": rng.random(50) > 0.5,
              "h": rng.standard_normal((64, 65)).astype(np.float16)[:, ::2], "s": np.float32(3.5),
              "e": np.zeros((0, 4), np.float32), "x": rng.standard_normal(4097).astype(ml_dtypes.bfloat16)},
    }  # fmt: skip
    assert sum(np.size(x) for x in jax.tree.leaves(tree)) > norms.PARALLEL_ABOVE

    def in_order(values):  # not sum(): Python 3.12's compensates
        total = 0.0
        for v in values:
            total += v
        return total

    leaves = jax.tree.leaves(tree)
    sums = [float(np.sum(np.square(np.array(np.asarray(x), np.float64, order="C", copy=True).reshape(-1))))
            for x in leaves]  # fmt: skip
    got = tree_norms(tree, "param_norm")
    assert got["param_norm"] == math.sqrt(in_order(sums))
    assert got["param_norm/b"] == math.sqrt(in_order(sums[3:]))  # "a" holds 3 leaves in flatten order
    assert norms.sums_of_squares(leaves) == sums


# ----------------------------------------------------------------------------------- bit-exact roundtrip
def test_roundtrip_bit_exact_realistic_state(tmp_path, capsys):
    state = make_state()
    assert int(state["opt_state"].mini_step) == 1  # 3 micro-steps with k=2: accumulation in progress
    with ck.Checkpointer(tmp_path, async_save=False) as c:
        c.save(3, state, {"config": {"lr": 1e-3}})
        assert c.latest_step() == 3
        restored, meta = c.restore(3, make_target())
    ck.assert_trees_identical(state, restored, "state")  # raises on any structure/dtype/shape/bit diff
    os_ = restored["opt_state"]
    assert type(os_) is optax.MultiStepsState
    assert type(os_.inner_opt_state[0]) is optax.ScaleByAdamState
    assert os_.mini_step.dtype == jnp.int32 and os_.mini_step.shape == () and int(os_.mini_step) == 1
    assert int(os_.gradient_step) == 1
    assert os_.inner_opt_state[0].count.dtype == jnp.int32 and int(os_.inner_opt_state[0].count) == 1
    assert restored["params"]["encoder"]["block_0"]["norm"]["scale"].dtype == jnp.bfloat16
    assert type(restored["step"]) is int and restored["step"] == 3
    assert restored["rng_key"].dtype == np.uint32
    np.testing.assert_array_equal(
        np.asarray(os_.acc_grads["probe"]["kernel"]),
        np.asarray(state["opt_state"].acc_grads["probe"]["kernel"]),
    )
    assert meta["norms"] == ck.state_norms(ck.to_host(state))
    # The resume check's norms read the state in place (no copy of it on a CPU), to the same bits.
    viewed = ck.to_host(state, copy=False)
    assert meta["norms"] == ck.state_norms(viewed)
    kernel = state["params"]["probe"]["kernel"]
    assert np.shares_memory(viewed["params"]["probe"]["kernel"], np.asarray(kernel))
    assert not np.shares_memory(ck.to_host(state)["params"]["probe"]["kernel"], np.asarray(kernel))
    assert meta["norms"]["param_norm"] == tree_norms(state["params"])["param_norm"]
    assert {"param_norm/encoder", "param_norm/projector", "param_norm/probe"} <= set(meta["norms"])
    out = capsys.readouterr().out
    pn = meta["norms"]["param_norm"]
    assert f"CKPT_SAVE step=3 param_norm={pn!r}" in out
    assert f"CKPT_RESTORE step=3 saved={pn!r} restored={pn!r} ratio=1.0" in out
    assert c.last_restore["ckpt/restore_ratio"] == 1.0
    # The restored opt_state keeps working: one more micro-step gives identical results on both.
    opt = _ns["make_opt"]()
    g = jax.tree.map(jnp.ones_like, state["params"])
    u1, s1 = opt.update(g, state["opt_state"], state["params"])
    u2, s2 = opt.update(g, restored["opt_state"], restored["params"])
    ck.assert_trees_identical((u1, s1), (u2, s2), "next_update")


def test_debug_roundtrip_helpers(tmp_path):
    state = make_state(seed=5)
    ck.roundtrip(tmp_path / "debug", 7, state, {"note": "x"})
    restored, meta = ck.load(tmp_path / "debug", make_target())
    ck.assert_trees_identical(state, restored)
    assert meta["step"] == 7
    bad = jax.tree.map(lambda x: x, restored)
    bad["params"]["probe"]["bias"] = bad["params"]["probe"]["bias"].at[2].add(1e-6)
    with pytest.raises(AssertionError, match=r"\['params'\]\['probe'\]\['bias'\].*flat index 2"):
        ck.assert_trees_identical(restored, bad)
    with pytest.raises(AssertionError, match="dtypes differ"):
        ck.assert_trees_identical({"a": np.zeros(2, np.float32)}, {"a": np.zeros(2, np.float64)})


# --------------------------------------------------------------------------- replicated over 4 devices
SAVE_REPLICATED = """
import sys, pathlib
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from birdjepa.rundir import checkpoint as ck
assert jax.device_count() == 4, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("data",))
repl = NamedSharding(mesh, P())
state = make_state()
dev_state = {**state, "params": jax.device_put(state["params"], repl),
             "opt_state": jax.device_put(state["opt_state"], repl)}
leaf = dev_state["params"]["encoder"]["patch_embed"]["kernel"]
assert len(leaf.sharding.device_set) == 4 and leaf.is_fully_replicated
c = ck.Checkpointer(pathlib.Path(sys.argv[1]), async_save=True)
c.save(3, dev_state, {"n_devices": 4})
c.wait()
# restore into a replicated 4-device target in this process as well
target = make_target()
target = {**target, "params": jax.device_put(target["params"], repl),
          "opt_state": jax.device_put(target["opt_state"], repl)}
restored, meta = c.restore(3, target)
assert restored["params"]["probe"]["kernel"].sharding == repl
ck.assert_trees_identical(state, restored)
c.close()
print("SAVED_OK", repr(meta["norms"]["param_norm"]))
"""


def test_replicated_four_devices_save_then_one_device_restore(tmp_path, capsys):
    """Regression test for the sqrt(n_devices) scaling of restored replicated arrays: saved by a process
    of 4 devices, restored here (one device)."""
    flags = os.environ.get("XLA_FLAGS", "")  # this process's, so the norm computed here is theirs
    out = _run(
        SAVE_REPLICATED, {"XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count=4"}, str(tmp_path)
    )
    state = make_state()
    norm = tree_norms(state["params"])["param_norm"]
    assert f"SAVED_OK {norm!r}" in out
    assert jax.device_count() == 1, jax.devices()
    capsys.readouterr()
    c = ck.Checkpointer(tmp_path)
    restored, meta = c.restore(c.latest_step(), make_target())
    ck.assert_trees_identical(state, restored)
    assert meta["norms"]["param_norm"] == norm and meta["n_devices"] == 4
    assert meta["norms"] == ck.state_norms(restored)
    assert "ratio=1.0" in capsys.readouterr().out


# ------------------------------------------------------------------------------- verification catches
def test_tampered_array_on_disk_is_caught(tmp_path):
    state = make_state()
    c = ck.Checkpointer(tmp_path, async_save=False)
    c.save(3, state, {})
    # Rewrite the state item with one leaf scaled by sqrt(4), as the old Orbax bug did.
    step_dir = c.directory / "3" / "state"
    leaves = jax.tree_util.tree_flatten_with_path(ck.to_host(state))[0]
    flat = {f"leaf_{i:06d}": a for i, (_, a) in enumerate(leaves)}
    (i,) = [i for i, (p, _) in enumerate(leaves) if jax.tree_util.keystr(p).startswith("['params']['proj")]
    flat[f"leaf_{i:06d}"] = (leaves[i][1] * np.float32(2.0)).astype(np.float32)
    shutil.rmtree(step_dir)
    with ocp.StandardCheckpointer() as raw:
        raw.save(step_dir.absolute(), flat)
    with pytest.raises(
        ck.IntegrityError, match=r"leaf \['params'\]\['proj.* differs from its recorded CRC-32"
    ):
        ck.Checkpointer(tmp_path, async_save=False).restore(3, make_target())


def test_a_checkpoint_without_orbax_s_metadata_file_restores_with_one_warning_of_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Its _CHECKPOINT_METADATA gone (a half-deleted copy): it verifies by birdjepa's own hashes, and
    # Orbax said "Metadata file does not exist" at each of its reads, 10 lines in one resume.
    state = make_state()
    with ck.Checkpointer(tmp_path, async_save=False) as c:
        c.save(3, state, {})
    (tmp_path / "checkpoints" / "3" / "_CHECKPOINT_METADATA").unlink()
    with caplog.at_level("WARNING"):
        for _ in range(2):
            with ck.Checkpointer(tmp_path, async_save=False) as c:
                restored = c.restore_latest(make_target())
                assert restored is not None and restored[0] == 3
    said = [r.getMessage() for r in caplog.records if "Metadata file does not exist" in r.getMessage()]
    assert len(said) == 1, said


def test_tampered_recorded_norm_is_caught(tmp_path):
    state = make_state()
    c = ck.Checkpointer(tmp_path, async_save=False)
    c.save(3, state, {})
    meta_file = c.directory / "3" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    good = meta["norms"]["opt_state_norm/acc_grads"]
    meta["norms"]["opt_state_norm/acc_grads"] = float(np.nextafter(good, np.inf))  # one ulp
    from birdjepa.rundir.checkpoint.integrity import meta_crc

    meta["meta_crc"] = meta_crc(meta)  # the norm comparison's own catch, past the meta's CRC-32
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ck.NormMismatchError, match=r"opt_state_norm/acc_grads saved="):
        ck.Checkpointer(tmp_path, async_save=False).restore(3, make_target())


def test_structure_mismatch_is_caught(tmp_path):
    c = ck.Checkpointer(tmp_path, async_save=False)
    c.save(1, make_state(), {})
    target = make_target()
    target["params"]["probe"]["bias"] = jnp.zeros(6)
    with pytest.raises(ck.CheckpointError, match=r"\['probe'\]\['bias'\] saved as shape=\[5\]"):
        c.restore(1, target)
    target = make_target()
    del target["params"]["probe"]
    with pytest.raises(ck.CheckpointError, match="target structure differs"):
        c.restore(1, target)


# ------------------------------------------------------------------------------ manager behaviour
def test_keep_last_n_and_async_save_while_in_flight(tmp_path):
    state = make_state()
    c = ck.Checkpointer(tmp_path, keep=2, async_save=True)
    for step in range(1, 6):
        s = {**state, "step": step}
        c.save(step, s, {"i": step})  # the next save starts while the previous one may be in flight
    c.wait()
    assert c.all_steps() == [4, 5]
    assert sorted(p.name for p in c.directory.iterdir()) == ["4", "5"]
    for step in (4, 5):
        restored, meta = c.restore(step, make_target())
        assert restored["step"] == step and meta["i"] == step
        ck.assert_trees_identical(state["params"], restored["params"])
    c.close()
    # a new process (new Checkpointer) sees the same steps
    assert ck.Checkpointer(tmp_path).all_steps() == [4, 5]


def test_an_old_checkpoint_that_cannot_be_removed_is_said_once_and_the_saves_go_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Another user's files (an admin's chmod -R a-w): Orbax's PermissionError went up from the retention,
    # and every launch trained to its first save and died there, exit 1, nothing naming the checkpoint.
    c = ck.Checkpointer(tmp_path, keep=1, async_save=False)
    real = c._mngr.delete

    def denied(step: int) -> None:
        if step == 1:
            raise PermissionError(13, "Permission denied", str(tmp_path / "1" / "_CHECKPOINT_METADATA"))
        real(step)

    c._mngr.delete = denied
    for step in (1, 2, 3):
        c.save(step, {**make_state(), "step": step}, {"i": step})
        c.wait()
    assert c.all_steps() == [1, 3]
    said = capsys.readouterr().out
    where = tmp_path / "checkpoints" / "1"
    assert said.count(f"WARNING checkpoint 1 could not be removed (Permission denied, in {where})") == 1, said
    assert "which --ckpt-keep 1 no longer keeps: the run trains on; remove it by hand" in said
    (warning,) = c.take_warnings()  # for the trainer's log, where the console alone held it
    assert warning.startswith("checkpoint 1 could not be removed (Permission denied")
    assert not c.take_warnings()
    c.close()


def test_a_reader_of_a_live_run_lists_again_and_passes_over_a_step_its_retention_removes(
    tmp_path, monkeypatch
):
    # `trace` on a live run: Orbax listed the folder, the trainer's retention removed a step, and Orbax's
    # look into it raised FileNotFoundError (after the whole replay: the trace was lost); `bisect` read a
    # meta half removed ("Item meta was not found").
    from birdjepa.rundir.checkpoint import store

    state = make_state()
    c = ck.Checkpointer(tmp_path, keep=None, async_save=False)
    for step in (1, 2, 3):
        c.save(step, {**state, "step": step}, {"i": step})
    reload, restore = c._mngr.reload, c._mngr.restore
    raced = []

    def racing_reload():
        if not raced:  # the retention removes step 1 as Orbax looks into it
            raced.append(1)
            shutil.rmtree(c.directory / "1")
            raise FileNotFoundError(2, "No such file or directory", str(c.directory / "1"))
        return reload()

    def racing_restore(step, **kw):
        if step == 2:  # removed as its meta is read
            shutil.rmtree(c.directory / "2")
        return restore(step, **kw)

    monkeypatch.setattr(c._mngr, "reload", racing_reload)
    monkeypatch.setattr(c._mngr, "restore", racing_restore)
    assert c.all_steps() == [2, 3] and raced
    assert c.meta_unless_pruned(2) is None
    assert c.meta_unless_pruned(3)["i"] == 3
    # A step still there whose meta cannot be read is damaged, not pruned: said.
    shutil.rmtree(c.directory / "3" / "meta")
    monkeypatch.setattr(store, "PRUNE_WAIT_S", 0.1)
    with pytest.raises((KeyError, OSError, ValueError)):
        c.meta_unless_pruned(3)
    c.close()


def test_latest_step_ignores_incomplete_checkpoints(tmp_path):
    state = make_state()
    c = ck.Checkpointer(tmp_path, async_save=False)
    c.save(1, state, {})
    c.save(2, {**state, "step": 2}, {})
    c.close()
    d = c.directory
    # What Orbax 0.12.8 leaves when a process dies mid-save: the step lives in a tmp folder that is only
    # renamed to "<step>" once every item is committed.
    shutil.copytree(d / "2", d / "3.orbax-checkpoint-tmp")
    shutil.rmtree(d / "3.orbax-checkpoint-tmp" / "meta")
    # A final-named folder with an item missing (e.g. a truncated copy) is damaged: listed, and passed
    # over (moved aside) by the restore of the newest that verifies.
    shutil.copytree(d / "2", d / "4")
    shutil.rmtree(d / "4" / "state")
    c2 = ck.Checkpointer(tmp_path)
    assert c2.all_steps() == [1, 2, 4]
    with pytest.raises(ck.IntegrityError, match="its state folder is missing"):
        c2.restore(4, make_target())
    shutil.rmtree(d / "4" / "meta")
    with pytest.raises(ck.IntegrityError, match="its meta and state folders are missing"):
        c2.restore(4, make_target())
    step, restored, _ = c2.restore_latest(make_target())
    assert step == 2 and restored["step"] == 2 and c2.all_steps() == [1, 2]
    assert [f["checkpoint"] for f in c2.fallbacks] == [4] and (tmp_path / ck.DAMAGED_DIR / "4").is_dir()
    with pytest.raises(ck.CheckpointError, match="no complete checkpoint for step 3"):
        c2.restore(3, make_target())


CRASH_MID_SAVE = """
import os, sys, pathlib
from birdjepa.rundir import checkpoint as ck
c = ck.Checkpointer(pathlib.Path(sys.argv[1]), async_save=True)
state = make_state()
c.save(1, state, {})
c.wait()
big = {**state, "extra": np.random.default_rng(0).standard_normal((4096, 2048)).astype(np.float32)}
c.save(2, big, {})
os._exit(0)  # killed while step 2 is being written in the background
"""


def test_crash_mid_async_save_leaves_previous_checkpoint_usable(tmp_path):
    _run(CRASH_MID_SAVE, {}, str(tmp_path))
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    c = ck.Checkpointer(tmp_path)
    if "2" in names:  # the background write happened to finish before the process died
        assert c.latest_step() == 2
    else:
        assert c.latest_step() == 1, names
        restored, _ = c.restore(1, make_target())
        ck.assert_trees_identical(make_state(), restored)
        # The resumed run writes step 2 again over the stale tmp folder.
        c.save(2, {**make_state(), "step": 2}, {})
        assert c.latest_step() == 2
        assert sorted(p.name for p in c.directory.iterdir()) == ["1", "2"]
        assert c.restore(2, make_target())[0]["step"] == 2


def test_metadata_json_roundtrip(tmp_path):
    key = jax.random.key(42)
    meta = {
        "config": {
            "model": {"depth": 12, "dims": [64, 128]},
            "lr": 0.1 + 0.2,
            "name": "vit-s/16",
            "ok": True,
        },
        "git_commit": "0123abcd" * 5,
        "loader": {"epoch": 2, "position": 12345, "buffer": list(range(50)), "shards": {"a.arrow": 7}},
        "prng_key_data": [int(v) for v in np.asarray(jax.random.key_data(key))],
        "monitor": {"ema_loss": 1.2345678901234567, "history": [[1, 2.5], [2, None]]},
        "dataset_fingerprint": "sha256:ff",
    }
    c = ck.Checkpointer(tmp_path, async_save=True)
    c.save(10, make_state(), meta)
    meta["config"]["lr"] = -1.0  # mutating the caller's dict after save must not change the checkpoint
    c.wait()
    _, got = c.restore(10, make_target())
    meta["config"]["lr"] = 0.1 + 0.2
    for k, v in meta.items():
        assert got[k] == v, k
    assert got["step"] == 10
    k2 = jax.random.wrap_key_data(jnp.asarray(got["prng_key_data"], dtype=jnp.uint32))
    assert np.array_equal(jax.random.key_data(k2), jax.random.key_data(key))
    with pytest.raises(ck.CheckpointError, match="not JSON-serialisable"):
        c.save(11, make_state(), {"bad": np.float32(1.0)})
    with pytest.raises(ValueError, match="reserved"):
        c.save(11, make_state(), {"norms": {}})
    c.close()


# ------------------------------------------------------------------------------- integrity and fallback
def largest_array_file(step_dir: Path) -> Path:
    return max((step_dir / "state").rglob("d/*"), key=lambda p: p.stat().st_size)


def flip(at: float):
    def damage(step_dir: Path) -> None:
        f = largest_array_file(step_dir)
        data = bytearray(f.read_bytes())
        data[int(len(data) * at)] ^= 0x40
        f.write_bytes(bytes(data))

    return damage


def ulp(step_dir: Path) -> None:
    """One element of one leaf one ulp off (its lowest mantissa bit), written through Orbax itself."""
    c = ck.Checkpointer(step_dir.parent.parent, keep=None, async_save=False)
    flat = {f"leaf_{i:06d}": a for i, a in enumerate(c.read_arrays(int(step_dir.name)).values())}
    kernel = next(k for k, a in flat.items() if a.ndim == 2)
    flat[kernel] = flat[kernel].copy()
    flat[kernel].flat[7] = np.nextafter(flat[kernel].flat[7], np.float32(np.inf))
    shutil.rmtree(step_dir / "state")
    with ocp.StandardCheckpointer() as raw:
        raw.save((step_dir / "state").absolute(), flat)


def truncate(step_dir: Path) -> None:
    f = largest_array_file(step_dir)
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


DAMAGE = {
    "byte flipped at 40%": flip(0.4),
    "lowest mantissa bit": ulp,
    "array file truncated": truncate,
    "array file deleted": lambda d: largest_array_file(d).unlink(),
    "meta missing": lambda d: shutil.rmtree(d / "meta"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damage_is_caught_and_the_restore_falls_back_to_the_newest_that_verifies(tmp_path, damage):
    state = make_state()
    older = {**state, "step": 1}
    with ck.Checkpointer(tmp_path, keep=None, async_save=False) as c:
        c.save(1, older, {})
        c.save(2, {**state, "step": 2}, {})
    DAMAGE[damage](tmp_path / "checkpoints" / "2")
    c = ck.Checkpointer(tmp_path, keep=None, async_save=False)
    with pytest.raises(ck.IntegrityError, match="checkpoints/2"):
        c.restore(2, make_target())
    step, restored, _ = c.restore_latest(make_target())
    assert step == 1
    ck.assert_trees_identical(jax.device_get(older), jax.device_get(restored), "restored")
    (fallback,) = c.fallbacks
    assert fallback["checkpoint"] == 2 and fallback["moved_to"] == str(tmp_path / ck.DAMAGED_DIR / "2")
    assert c.all_steps() == [1]  # moved aside: never picked again


def test_a_changed_byte_in_the_meta_is_damage(tmp_path):
    # The meta's config is what a bare resume trains with: one byte (b2 0.999 -> 0.995) trained on with
    # every resume check passing and exit 0; the arrays alone had CRC-32s.
    with ck.Checkpointer(tmp_path, keep=None, async_save=False) as c:
        c.save(1, make_state(), {"config": {"optim": {"b2": 0.999}}})
    meta_file = tmp_path / "checkpoints" / "1" / "meta" / "metadata"
    meta_file.write_text(meta_file.read_text().replace("0.999", "0.995"))
    with pytest.raises(ck.IntegrityError, match="meta differs from its recorded CRC-32"):
        ck.Checkpointer(tmp_path, keep=None).restore(1, make_target())


def test_a_flipped_byte_anywhere_is_caught_or_was_never_read(tmp_path):
    # The array files are compressed: most flips change decoded values (only the CRC-32 sees a change in
    # a low mantissa bit), some break the decoding, and a few land in bytes the restore does not read.
    # Never a silent wrong answer: a restore that passes returns the saved state bit for bit.
    state = {**make_state(), "step": 2}
    caught = 0
    for i in range(10):
        d = tmp_path / str(i)
        with ck.Checkpointer(d, keep=None, async_save=False) as c:
            c.save(2, state, {})
        flip(i / 10)(d / "checkpoints" / "2")
        try:
            restored, _ = ck.Checkpointer(d, keep=None).restore(2, make_target())
        except ck.IntegrityError:
            caught += 1
            continue
        ck.assert_trees_identical(jax.device_get(state), jax.device_get(restored), f"flip at {i / 10}")
    assert caught >= 8, caught


def test_no_checkpoint_that_verifies_raises_and_a_newer_format_names_both_versions(tmp_path):
    with ck.Checkpointer(tmp_path, keep=None, async_save=False) as c:
        c.save(1, make_state(), {})
    flip(0.5)(tmp_path / "checkpoints" / "1")
    with pytest.raises(ck.NoValidCheckpointError, match="no checkpoint in .* verifies"):
        ck.Checkpointer(tmp_path, keep=None).restore_latest(make_target())
    # A checkpoint of a newer format (its meta's CRC-32 holds) is not damaged: it stays where it is, and
    # the error says why.
    with ck.Checkpointer(tmp_path, keep=None, async_save=False) as c:
        c.save(2, make_state(), {})
    meta_file = tmp_path / "checkpoints" / "2" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    rewrite_meta(meta_file, {k: v for k, v in meta.items() if k != "meta_crc"} | {"checkpoint_format": 4})
    with pytest.raises(ck.CheckpointError, match="checkpoint format 4, this birdjepa reads formats 1, 2, 3"):
        ck.Checkpointer(tmp_path, keep=None).restore_latest(make_target())
    assert (tmp_path / "checkpoints" / "2").is_dir()


def test_a_format_digit_changed_by_damage_is_damage_and_the_older_checkpoint_resumes(tmp_path):
    # One bit ('3' -> '7') read as "a newer birdjepa wrote it": exit 65 at every start, and the older
    # checkpoint that verifies was never tried. Its meta's CRC-32 no longer holds: damage.
    with ck.Checkpointer(tmp_path, keep=None, async_save=False) as c:
        c.save(1, make_state(), {})
        c.save(2, make_state(), {})
    meta_file = tmp_path / "checkpoints" / "2" / "meta" / "metadata"
    meta_file.write_text(meta_file.read_text().replace('"checkpoint_format": 3', '"checkpoint_format": 7'))
    found = ck.Checkpointer(tmp_path, keep=None).restore_latest(make_target())
    assert found is not None and found[0] == 1 and not (tmp_path / "checkpoints" / "2").exists()


def test_retention_keeps_the_newest_checkpoint_that_verifies_and_refuses_a_non_finite_save(tmp_path):
    state = make_state()
    c = ck.Checkpointer(tmp_path, keep=1, async_save=False)
    c.save(1, state, {})
    c.save(2, state, {})
    flip(0.5)(tmp_path / "checkpoints" / "2")
    c.wait()  # keep=1 would leave only 2, which does not verify: 1 stays
    assert c.all_steps() == [1, 2]
    c.save(3, state, {})
    assert c.all_steps() == [3]  # 3 verifies: the older ones go
    bad = {**state, "params": jax.tree.map(lambda p: p * np.float32(np.nan), state["params"])}
    with pytest.raises(ck.CheckpointError, match=r"refusing to save step 4: param_norm=nan is not finite"):
        c.save(4, bad, {})
    c.close()
    assert c.all_steps() == [3]


def test_a_refused_commit_leaves_the_taker_s_save_of_the_same_step_whole(tmp_path: Path) -> None:
    """A trainer woken after another took its run over: its save of step 2, written before it stopped,
    asks to be committed while the taker's save of step 2 is being written (Orbax names both folders by
    the step). The refusal removed that folder, the taker's by then: its save failed, "No such file"."""
    import threading

    from birdjepa.rundir.lease import LeaseLost

    entered, go, refused = threading.Event(), threading.Event(), threading.Event()

    def old_holder() -> None:
        entered.set()
        go.wait(60)
        raise LeaseLost(tmp_path, {"pid": 4242, "host": "node17", "token": "f", "heartbeat": 0.0}, 99.0)

    def taker() -> None:  # its first item's rename comes once the old holder's commit was refused
        if not go.is_set():
            go.set()
            refused.wait(60)

    old = ck.Checkpointer(tmp_path, before_commit=old_holder)
    old.save(2, {"w": np.arange(4.0)}, {"who": "old"})
    entered.wait(60)
    new = ck.Checkpointer(tmp_path, before_commit=taker)
    new.save(2, {"w": np.arange(4.0) * 10}, {"who": "taker"})
    with pytest.raises(LeaseLost, match="went 99 s without renewing its lease"):
        old.wait()
    refused.set()
    new.wait()
    state, meta = ck.Checkpointer(tmp_path, async_save=False).restore(2, {"w": np.zeros(4)})
    assert np.array_equal(state["w"], np.arange(4.0) * 10) and meta["who"] == "taker"
