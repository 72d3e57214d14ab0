"""`rally serve agent`: the node agent service (one per GPU node). Logic lives in ``rallypoint.agent``."""
