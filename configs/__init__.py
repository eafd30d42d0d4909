"""Training configs: each file's get_config() returns an ml_collections.ConfigDict."""
