"""mlxd.shared.wire"""
