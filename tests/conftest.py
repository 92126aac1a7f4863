"""Test-suite configuration shared by every test directory."""


def pytest_configure(config):
    # numpy warns when a signalling-NaN bit pattern is widened; the tests do that on purpose
    config.addinivalue_line("filterwarnings", "ignore:invalid value encountered in cast:RuntimeWarning")
