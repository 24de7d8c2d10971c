"""Precision: fp16 with fp32 islands, decided from measured ranges (given as data).

:mod:`.convert` is what ``fp16`` does after measuring; :mod:`.fused` what ``fuse
--precision fp16`` does; :mod:`.islands` shows the decisions as a table.
"""
