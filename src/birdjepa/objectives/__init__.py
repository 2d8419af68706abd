"""Pretraining objectives, one module each, chosen by ``--objective.kind`` (`options.REGISTRY`).

base.py        what an objective provides (`Objective`) and what the step gives it (`Model`)
options.py     every objective's options, their checks, the registry (no JAX)
lejepa.py      invariance + SIGReg (sigreg.py), with multi-crop and the masked-span term (span.py)
mae.py         masked patch reconstruction with a light decoder
supervised.py  cross-entropy on the labels (the ceiling), and the masked cross-entropy of every probe
health.py      the online probe and the collapse ranks every step computes beside its objective
"""
