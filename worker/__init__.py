"""mlxd.worker"""
