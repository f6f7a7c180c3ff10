"""Stub transformer_engine so Megatron-Bridge's config modules import on CPU (no TE kernels run)."""
import importlib.abc, importlib.machinery, sys, types

class _Any(types.ModuleType):
    __path__ = []
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        if full not in sys.modules:
            mod = _Any(full)
            sys.modules[full] = mod
        return sys.modules[full]
    def __call__(self, *a, **k):
        return self
    def __mro_entries__(self, bases):
        return (object,)

class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "transformer_engine" or name.startswith("transformer_engine."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        return _Any(spec.name)
    def exec_module(self, module):
        pass

sys.meta_path.insert(0, _Finder())
