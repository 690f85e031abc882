"""``gymckpt demo``: the whole story on one machine, compared with an uninterrupted run."""
