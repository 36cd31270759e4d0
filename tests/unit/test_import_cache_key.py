"""The key of transformers' saved import table (worker/import_cache.py): any change to a
source file of the package names another table; nothing else does."""

import os

from mlxd.worker import import_cache


def test_a_source_file_changed_in_place_changes_the_key(tmp_path):
    pkg = tmp_path / "transformers"
    (pkg / "models" / "llama" / "__pycache__").mkdir(parents=True)
    src = pkg / "models" / "llama" / "configuration_llama.py"
    src.write_text('__all__ = ["LlamaConfig"]\n')
    (pkg / "__init__.py").write_text('__version__ = "5.25.0"\n')
    tree = import_cache._tree.__wrapped__  # uncached: one walk per call here
    before = tree(str(pkg))
    (pkg / "models" / "llama" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (pkg / "models" / "README.md").write_text("notes")
    assert tree(str(pkg)) == before  # bytecode and other files do not count
    st = src.stat()
    src.write_text('__all__ = ["LlamaConfig", "ProbeConfig"]\n')
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))  # same time, other size
    assert tree(str(pkg)) != before
    src.write_text('__all__ = ["LlamaConfig"]\n')
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # same size, other time
    assert tree(str(pkg)) != before
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert tree(str(pkg)) == before
