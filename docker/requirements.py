"""Print the project's runtime dependencies from pyproject.toml, one a line, torch left out.

The images install torch first from the index of their build (CPU or CUDA) and then these, so
that pip never replaces that build with another; only pyproject.toml is copied for this step,
so the dependency layer is rebuilt only when the dependencies change.
"""

import sys
import tomllib

with open(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml", "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
print("\n".join(d for d in deps if not d.replace(" ", "").startswith(("torch=", "torch>", "torch<"))))
