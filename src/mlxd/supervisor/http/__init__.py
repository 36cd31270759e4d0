"""mlxd.supervisor.http"""
