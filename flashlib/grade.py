"""``python -m flashlib.grade NOTEBOOK_OR_FOLDER``: see :mod:`flashlib.course.grader`."""
import sys

from flashlib.course.grader import main

if __name__ == "__main__":
    sys.exit(main())
