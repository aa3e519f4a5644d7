"""``python -m decodekit bench ...``"""

from decodekit.cli import main

if __name__ == "__main__":
    main()
