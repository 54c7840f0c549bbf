"""Print the include directory of a header package the build needs, without importing it.

    python cmake/locate_headers.py cutlass   # CUTLASS/CuTe, from the nvidia-cutlass wheel
    python cmake/locate_headers.py xla_ffi   # XLA FFI, from the installed jaxlib

CMake runs this only when the matching override (JAX_SWIGLU_CUTLASS_INCLUDE_DIR,
JAX_SWIGLU_XLA_FFI_INCLUDE_DIR) is not set. Exits 1 with a message on stderr if nothing
is found.

The XLA FFI headers must come from the jaxlib the extension will run with (a handler
built against newer headers than the runtime jaxlib is refused), so we look first in the
site-packages of the environment being installed into (under pip's build isolation the
build interpreter cannot import that jaxlib, but its files are on disk there), and only
then at the build requirements' jaxlib, which pip resolves to the same newest release
it installs at run time when none was installed before.
"""

import importlib.util
import os
import site
import sys
import sysconfig


def _installed_dirs(name):
    """``name`` in the environment being installed into. Under pip's build isolation the
    build interpreter cannot import from it, but sys.prefix still points at it."""
    roots = set()
    for prefix in (sys.prefix, os.environ.get("VIRTUAL_ENV", "")):
        if prefix:
            paths = sysconfig.get_paths(vars={"base": prefix, "platbase": prefix})
            roots.update(paths[key] for key in ("purelib", "platlib"))
    if site.ENABLE_USER_SITE:
        roots.add(site.getusersitepackages())
    for root in sorted(roots):
        candidate = os.path.join(root, name)
        if os.path.isdir(candidate):
            yield candidate


def _importable_dirs(name):
    """``name`` as the build interpreter sees it (the build requirements, if isolated)."""
    spec = importlib.util.find_spec(name)  # finds, does not execute the package
    if spec is not None and spec.submodule_search_locations:
        yield from spec.submodule_search_locations


def locate(what):
    if what == "cutlass":  # the pinned build requirement first
        package, subdir, probe = "cutlass_library", "source/include", "cutlass/cutlass.h"
        order = (_importable_dirs, _installed_dirs)
    elif what == "xla_ffi":  # the jaxlib that will run the extension first
        package, subdir, probe = "jaxlib", "include", "xla/ffi/api/ffi.h"
        order = (_installed_dirs, _importable_dirs)
    else:
        raise SystemExit(f"unknown header package {what!r}")
    for directory in (d for finder in order for d in finder(package)):
        include = os.path.join(directory, subdir)
        if os.path.isfile(os.path.join(include, probe)):
            return include
    return None


if __name__ == "__main__":
    found = locate(sys.argv[1])
    if found is None:
        print(f"could not find the {sys.argv[1]} headers", file=sys.stderr)
        sys.exit(1)
    print(found)
