"""autocompress.data"""
