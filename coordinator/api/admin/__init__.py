"""/api/v1/admin/...: API keys and nodes (list, create, revoke, rotate), operators only.

routes.py   the routes
schemas.py  their request and response Structs
"""
