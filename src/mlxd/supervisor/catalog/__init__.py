"""mlxd.supervisor.catalog"""
