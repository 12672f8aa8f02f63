"""The plugin registry: names from metadata, lazy import, interface checks, one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from arch_plugins import catalogue, registry
from arch_plugins.interfaces import NormStrategy
from arch_plugins.norms.prenorm import RMSNormStrategy
from arch_plugins.registry import PluginError

GOOD_NORM = '''
from arch_plugins.interfaces import NormStrategy

class Fancy(NormStrategy):
    """A fancy norm for tests."""
    def __init__(self, gain: float = 1.0):
        self.gain = gain
'''


def test_builtins_are_listed_with_their_package():
    assert {"layernorm", "rmsnorm"} <= set(registry.names("norm"))
    assert "add" in registry.names("residual")
    assert "linear" in registry.names("projection")
    spec = registry.spec("norm", "rmsnorm")
    assert spec.package == "arch-lab" and spec.version and spec.target == "arch_plugins.norms.prenorm:RMSNormStrategy"


def test_listing_names_imports_no_plugin_code():
    code = ("import sys; from arch_plugins import registry; "
            "names = [registry.names(k) for k in registry.kinds()]; "
            "assert not [m for m in sys.modules if m.startswith(('arch_plugins.norms.', 'arch_plugins.residuals.', "
            "'arch_plugins.projections.'))], sorted(sys.modules); print(names)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "rmsnorm" in out.stdout


def test_create_loads_checks_and_configures():
    norm = registry.create("norm", "rmsnorm", {"eps": 1e-5})
    assert isinstance(norm, RMSNormStrategy) and norm.eps == 1e-5


def test_unknown_name_suggests_the_closest():
    with pytest.raises(PluginError) as e:
        registry.create("norm", "rmsnrom")
    msg = str(e.value)
    assert "did you mean 'rmsnorm'" in msg and "layernorm" in msg and "\n" not in msg


def test_unknown_option_names_the_accepted_ones():
    with pytest.raises(PluginError, match=r"no option 'epsilon'; did you mean 'eps'\? its options are: eps, affine"):
        registry.create("norm", "rmsnorm", {"epsilon": 1e-5})


def test_third_party_plugin_is_found_by_name(fake_site):
    fake_site("fancy-norms", "2.1.0", {"arch_plugins.norm": {"fancy": "fancy_mod:Fancy"}}, {"fancy_mod": GOOD_NORM})
    assert "fancy" in registry.names("norm")
    assert "fancy_mod" not in sys.modules  # listing imported nothing
    norm = registry.create("norm", "fancy", {"gain": 2.0})
    assert norm.gain == 2.0 and isinstance(norm, NormStrategy)
    assert registry.spec("norm", "fancy").origin == "fancy-norms==2.1.0"
    assert catalogue.summary(registry.spec("norm", "fancy")) == "A fancy norm for tests."


def test_broken_plugin_fails_only_when_selected(fake_site):
    fake_site("broken-norms", "0.3", {"arch_plugins.norm": {"broken": "broken_mod:Missing"}},
              {"broken_mod": "import not_a_real_module_xyz\n"})
    assert "broken" in registry.names("norm")
    registry.create("norm", "rmsnorm")  # other plugins are unaffected
    with pytest.raises(PluginError) as e:
        registry.create("norm", "broken")
    msg = str(e.value)
    assert "'broken'" in msg and "broken-norms==0.3" in msg and "not_a_real_module_xyz" in msg
    rows = catalogue.rows()  # listing imports nothing, so a broken plugin is still listed
    assert {"layernorm", "rmsnorm", "broken"} <= {r["name"] for r in rows if r["kind"] == "norm"}


def test_two_packages_claiming_one_name_are_both_named(fake_site):
    fake_site("pkg-a", "1.0", {"arch_plugins.norm": {"twin": "twin_a:Fancy"}}, {"twin_a": GOOD_NORM})
    fake_site("pkg-b", "2.0", {"arch_plugins.norm": {"twin": "twin_b:Fancy"}}, {"twin_b": GOOD_NORM})
    with pytest.raises(PluginError, match=r"claimed by two packages: pkg-a==1.0 .* and pkg-b==2.0"):
        registry.create("norm", "twin")


def test_plugin_of_the_wrong_kind_is_refused(fake_site):
    fake_site("confused", "1.0", {"arch_plugins.residual": {"oops": "oops_mod:Fancy"}}, {"oops_mod": GOOD_NORM})
    with pytest.raises(PluginError, match=r"not a subclass of arch_plugins.interfaces.ResidualType"):
        registry.load("residual", "oops")


def test_options_rejected_by_the_plugin_are_reported():
    class Picky(NormStrategy):
        """Rejects negative gains."""

        def __init__(self, gain: float = 1.0):
            if gain < 0:
                raise ValueError("gain must be >= 0")

    registry.register("norm", "picky", Picky)
    try:
        with pytest.raises(PluginError, match=r"norm 'picky' rejected its options \{'gain': -1\}: gain must be >= 0"):
            registry.create("norm", "picky", {"gain": -1})
    finally:
        registry.unregister("norm", "picky")


def test_unknown_kind():
    with pytest.raises(PluginError, match="kinds are: norm, residual, projection"):
        registry.names("activation")
