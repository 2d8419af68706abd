"""Pure diagnostics over what the loader yields (arrays in, metric dicts out); see `iid`."""
