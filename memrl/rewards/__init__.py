"""memrl.rewards"""
