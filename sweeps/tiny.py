"""Two tiny demo runs that differ in learning rate: a sweep file is plain Python returning overrides."""


def make_cfgs() -> list[dict]:
    base = {"steps": 40, "eval_every": 20, "ckpt_every": 10, "data.batch_size": 8, "log.print_every": 5}
    return [{**base, "optim.lr": lr} for lr in (1e-3, 3e-3)]
