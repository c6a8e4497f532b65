"""The repository's benchmarks (`scripts/bench/`) and tools (`scripts/tools/`): modules run from
the repository's root, `python -m scripts.bench.engine`, `python -m scripts.tools.docs_cli`, so
that they import each other and the tutorials by their package names. ajet never imports them.
"""
