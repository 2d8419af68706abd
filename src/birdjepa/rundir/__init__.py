"""The run directory: its names (`layout`), its one writer (`lease`), its metrics log (`metrics_log`) and
its checkpoint store (`checkpoint`, imported on its own: it brings JAX and Orbax)."""
