import Logging
import PeerLinkCore

// Resource limits at the session's door (issue 11): the link caps of ResourceLimits applied to
// every incoming link before it runs, and an accept loop that outlives a listener's transient
// failures. The runtime calls these from a few marked places (acceptLoop, register, admit,
// unregister); the decisions themselves are LinkAdmission's, in PeerLinkCore.

extension PeerSession {
    /// What the session holds and what its link caps did: links now (in their handshake, in
    /// all), incoming links refused and evicted since it started.
    public func resourceUsage() -> LinkAdmission<ObjectIdentifier>.Usage {
        core.withLock { $0.admission.usage }
    }

    /// Decides whether the incoming link on `channel` may run (``PeerLinkCore/LinkAdmission``).
    /// Over a cap its channel is closed at once — logged at debug, summarised at info at most
    /// every 10 s — and false is returned; a link in its handshake evicted to make room is
    /// closed with code 6.
    func admitIncoming(_ channel: any LinkChannel) -> Bool {
        let key = ObjectIdentifier(channel)
        let origin = LinkAdmission<ObjectIdentifier>.origin(ofRemote: channel.remoteDescription)
        let now = time.now()
        let limits = configuration.limits
        let (decision, victim) = core.withLockThenDeliver { core -> (LinkAdmission<ObjectIdentifier>.Decision, Link?) in
            let decision = core.admission.admit(key, from: origin, limits: limits, at: now)
            guard case .admitEvicting(let evicted) = decision.verdict else { return (decision, nil) }
            return (decision, core.links.values.first { ObjectIdentifier($0.link.channel) == evicted }?.link)
        }
        var metadata = localMetadata
        metadata["transport"] = "\(channel.transport)"
        metadata["link.remote"] = "\(channel.remoteDescription)"
        if let summary = decision.logSummary {
            logger.info(
                "incoming links over the resource limits: \(summary.refused) refused, \(summary.evicted) evicted in their handshake since the last report",
                metadata: metadata.merging(
                    ["links": "\(summary.links)", "links.handshaking": "\(summary.handshaking)"], uniquingKeysWith: { $1 }))
        }
        switch decision.verdict {
        case .admit:
            return true
        case .admitEvicting:
            if let victim {
                logger.debug("closing the oldest link in its handshake to make room", metadata: metadata)
                victim.close(code: .handshakeFailed, reason: "too many links in their handshake: the oldest made room for a newer one", linger: false)
            }
            return true
        case .refuse(let reason):
            metadata["reason"] = "\(reason)"
            logger.debug("incoming link refused", metadata: metadata)
            channel.close()
            return false
        }
    }

    /// Records a link the session runs that did not come through ``admitIncoming(_:)`` (a dial).
    /// At a cap, the oldest incoming link still in its handshake is closed to make room: the
    /// session's own dials go before unauthenticated strangers.
    func recordLink(_ channel: any LinkChannel, in core: inout SessionCore) {
        let evicted = core.admission.opened(
            ObjectIdentifier(channel), from: LinkAdmission<ObjectIdentifier>.origin(ofRemote: channel.remoteDescription),
            limits: configuration.limits)
        guard let evicted, let victim = core.links.values.first(where: { ObjectIdentifier($0.link.channel) == evicted })?.link else { return }
        core.outbox.add {
            victim.close(code: .handshakeFailed, reason: "too many links in their handshake: the oldest made room for a dial", linger: false)
        }
    }

    /// The accept loop's answer to a failed `accept`: false when the listener is closed (the
    /// loop ends, as before); otherwise a pause that grows with each failure in a row (the
    /// limits' ``PeerLinkCore/ResourceLimits/acceptBackoff``), then true — the loop goes on.
    /// Logged at info on the first failure of a row and every tenth after it.
    func acceptFailed(_ error: any Error, listener: any TransportListener, failuresInARow: inout Int) async -> Bool {
        if let error = error as? PeerLinkError, error.code == .notConnected {
            let reason = "no longer accepting links: \(Self.message(of: error))"
            logger.info("\(reason)", metadata: localMetadata)
            core.withLockThenDeliver { core in report(.linkFailed(nil, reason: reason), in: &core) }
            return false
        }
        let backoff = configuration.limits.acceptBackoff
        var pause = backoff.lowerBound
        for _ in 0..<min(failuresInARow, 30) {
            pause = min(pause * 2, backoff.upperBound)
        }
        if failuresInARow % 10 == 0 {
            var metadata = localMetadata
            metadata["reason"] = "\(Self.message(of: error))"
            metadata["accept.failures"] = "\(failuresInARow + 1)"
            logger.info("accepting a link failed; trying again after \(pause)", metadata: metadata)
        }
        failuresInARow += 1
        do {
            try await clock.sleep(for: pause)
        } catch {
            return false
        }
        return !stopped.isFired
    }
}
