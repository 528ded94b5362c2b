"""Shared pytest configuration. Fixtures live in tests/fixtures/, one module per concern."""

pytest_plugins = [
    "tests.fixtures.redis_server",
    "tests.fixtures.redis_cluster",
    "tests.fixtures.redis_sentinel",
    "tests.fixtures.coordination_backend",
    "tests.fixtures.trio_portal",
    "tests.fixtures.processes",
    "tests.fixtures.databases",
    "tests.fixtures.fake_servers",
]
