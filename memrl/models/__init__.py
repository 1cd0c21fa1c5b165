"""memrl.models"""
