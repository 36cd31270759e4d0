"""mlxd.supervisor.scheduling"""
