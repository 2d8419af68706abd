"""The encoder out of the harness: `birdjepa export` writes it (safetensors and a JSON card),
`load_encoder` reads an export or a run, `birdjepa embed` embeds recordings or shards with it.

- `card`: what an export holds besides the weights (model config, features, the checkpoint's identity);
- `encoder`: `load_encoder` and the `Encoder` it returns;
- `cli`: the two commands.
"""
