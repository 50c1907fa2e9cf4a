"""The benchmarks: a tool beside the product (`python -m bench`, `muster-bench`, or
`muster bench`, which runs it in a subprocess). See `bench/__main__.py` for the
entry points and docs/benchmarks.md for the method and the latest figures.

May import anything of Muster (`wire`, `server`, `agent`) and matplotlib (only in
`plot`, from the optional `[bench]` extra). Nothing of the product imports it
(import-linter).
"""
