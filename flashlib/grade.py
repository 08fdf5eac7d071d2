"""``python -m flashlib.grade NOTEBOOK_OR_FOLDER``: see :mod:`flashlib.course.grader`."""
import sys

# nbformat imports jsonschema, whose format checkers import the optional ``rfc3987_syntax``
# (installed with JupyterLab) and build its IRI grammar: 3 to 4 s of CPU at every start of the
# grader, for URI formats that no notebook schema checks. Marking it absent skips only that checker.
sys.modules.setdefault("rfc3987_syntax", None)

from flashlib.course.grader import main  # noqa: E402 - after the line above, on purpose

if __name__ == "__main__":
    sys.exit(main())
