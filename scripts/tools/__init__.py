"""The tools: what `make lint`, `make sandbox` and `make browser` run (check_import_cycles,
install_sandbox.sh, install_browser.sh), the generators of docs blocks (docs_cli, docs_results on
docs_blocks), the chaos run of tests/integration/test_chaos.py, and calibrate_cascade (the cost
constants of ajet.forward.cascade). Run from the repository's root:
`.venv/bin/python -m scripts.tools.docs_cli --check`.
"""
