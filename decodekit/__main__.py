"""``python -m decodekit bench ...``; ``python -m decodekit --help`` lists the commands."""

from decodekit.cli import main

if __name__ == "__main__":
    main()
