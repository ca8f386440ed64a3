import sys

from . import main

if __name__ == "__main__":  # pytest's --doctest-modules imports this file too
    sys.exit(main(sys.argv[1:]))
