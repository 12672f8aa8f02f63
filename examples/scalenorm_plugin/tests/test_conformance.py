"""ScaleNorm passes arch-lab's conformance kit, the checks every built-in plugin passes.

With the plugin installed (`pip install -e examples/scalenorm_plugin`): `pytest examples/scalenorm_plugin/tests`.
"""

import pytest

from arch_plugins.testing import conformance_cases


@pytest.mark.parametrize("case", conformance_cases("norm", "scalenorm"), ids=str)
def test_conforms(case):
    case.run()


@pytest.mark.parametrize("case", conformance_cases("norm", "scalenorm", options={"learnable": False}), ids=str)
def test_conforms_with_a_fixed_gain(case):
    case.run()
