"""``python -m hostir.cli``: the ``hostir`` command."""

from hostir.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
