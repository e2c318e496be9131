"""Whole-model certificates (`attnlip certify`): block certificates composed layer by layer, and the network
route (exact first order, composed curvature); the certified radius is where either proves every margin."""
