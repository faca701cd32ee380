"""Real federations: incofl's methods as a Flower app (docs/federation.md). Flower (the `flower`
extra) is imported by the app's modules through its public API, and past it only in the Flower
adapter, `incofl.deploy.flower`."""

# the node config keys that name a node's data, one of them: an exported share (site/sitedata.py) or a
# site's own (site/owndata.py); here, so that `up` names them without importing the engine
DATA_PATH, DATA_FOLDER, DATA_NPZ = "data-path", "data-folder", "data-npz"
# a reply's bytes beyond its states' (metrics, configs, its signature, Flower's object headers: a few KB):
# codec's, and the reply cap the facts file states (server/serverdata.py), which `up` reads without Flower
REPLY_OVERHEAD = 1 << 20
