"""``python -m guarded``: the same command line as the ``guarded`` script."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
