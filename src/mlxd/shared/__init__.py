"""mlxd.shared"""
