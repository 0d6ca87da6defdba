"""Allow ``python -m boxwatch``."""

from boxwatch.cli import main

if __name__ == "__main__":
    main()
