pytest_plugins = ["tests.fixtures.services", "tests.fixtures.cdc", "tests.fixtures.streaming"]
