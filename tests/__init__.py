"""The test suite as a package, so that shared helpers are imported by their full name
(``from tests.support.layout import SPM_P``): a bare ``from conftest import`` resolves to
whichever ``conftest.py`` pytest loaded last. Test folders below stay plain folders (pytest puts
each on ``sys.path``), so their own helper modules are imported by bare name."""
