"""`birdjepa benchmark`: frozen encoders scored the way bird-audio papers score them (BirdSet's protocol).

- `metrics`: cmAP, AUROC and top-1 on multi-label scores;
- `fewshot`: at most n recordings per class, drawn with a seed;
- `probes`: linear and MLP probes (binary cross-entropy or the asymmetric loss) and class centroids;
- `backbones`: what is scored (a run's checkpoint, the same architecture at random init, raw log-mel
  statistics, an external ``module:function``) and the cache of their embeddings;
- `store`: the Parquet results store (one file per result: skip-if-done, many writers);
- `tables`: the store as tables (over seeds; tasks as columns);
- `cli`: the command line, which runs them in that order and prints the table.
"""
