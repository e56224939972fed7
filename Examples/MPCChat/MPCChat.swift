// MPCChat: a chat written the way a MultipeerConnectivity app is — a MultipeerSession with a
// delegate, a NearbyServiceAdvertiser that accepts invitations, a NearbyServiceBrowser that
// finds peers — on the LAN (the default, as MPC) or over Bluetooth Classic (`--transport
// bluetooth`), with the same code. `--invite NAME` invites the peer called NAME once found; every
// copy accepts the invitations it gets. Typed lines go to every connected peer.
//
// Script-friendly: one line in is one message; "NAME: TEXT" for each message received,
// "* NAME connected" / "* NAME not connected" when peers come and go, "+ NAME found" when the
// browser finds one. At the end of input it sends what it read (waiting up to 60 s for a peer
// when lines wait), leaves the session and exits 0.
import Foundation
import Logging
import PeerLink
import PeerLinkExampleSupport

let tool = "peerlink-example-mpcchat"
let usage = """
    usage: \(tool) [--name NAME] [--service TYPE] [--transport T] [--adapter hciN] [--invite NAME] [--identity PATH]
      --name NAME      the name the others see (default: this host's name)
      --service TYPE   the service type to advertise and browse (default: mpcchat)
      --transport T    lan (the default, as MultipeerConnectivity), bluetooth, or auto (both)
      --adapter hciN   the Bluetooth adapter (default: the first one that is up)
      --invite NAME    invite the peer with this name once the browser finds it
      --identity PATH  the identity file (default: $XDG_CONFIG_HOME/peerlink/identity.json)
    """

/// Everything that happens, in one stream, so that one loop owns the state.
enum Input: Sendable {
    case line(String)
    case endOfInput
    case found(MultipeerPeerID)
    case state(MultipeerPeerID, PeerState)
    case message(MultipeerPeerID, Data)
    case failed(String)
}

/// The delegates: each call becomes an input; invitations are accepted into the session.
final class Delegate: MultipeerSessionDelegate, NearbyServiceAdvertiserDelegate, NearbyServiceBrowserDelegate {
    let input: AsyncStream<Input>.Continuation
    let session: MultipeerSession

    init(input: AsyncStream<Input>.Continuation, session: MultipeerSession) {
        self.input = input
        self.session = session
    }

    func session(_ session: MultipeerSession, peer peerID: MultipeerPeerID, didChange state: PeerState) {
        input.yield(.state(peerID, state))
    }

    func session(_ session: MultipeerSession, didReceive data: Data, fromPeer peerID: MultipeerPeerID) {
        input.yield(.message(peerID, data))
    }

    func advertiser(
        _ advertiser: NearbyServiceAdvertiser, didReceiveInvitationFromPeer peerID: MultipeerPeerID, withContext context: Data?,
        invitationHandler: @escaping @Sendable (Bool, MultipeerSession?) -> Void
    ) {
        invitationHandler(true, session)
    }

    func advertiser(_ advertiser: NearbyServiceAdvertiser, didNotStartAdvertisingPeer error: any Error) {
        input.yield(.failed("advertising did not start: \(error)"))
    }

    func browser(_ browser: NearbyServiceBrowser, foundPeer peerID: MultipeerPeerID, withDiscoveryInfo info: [String: String]?) {
        input.yield(.found(peerID))
    }

    func browser(_ browser: NearbyServiceBrowser, lostPeer peerID: MultipeerPeerID) {}

    func browser(_ browser: NearbyServiceBrowser, didNotStartBrowsingForPeers error: any Error) {
        input.yield(.failed("browsing did not start: \(error)"))
    }
}

@main
enum MPCChatExample {
    static func main() async {
        let arguments = parseArguments(["--name", "--service", "--transport", "--adapter", "--invite", "--identity"], usage: usage)
        let name = validName(arguments["--name"] ?? hostName())
        let service = validService(arguments["--service"] ?? "mpcchat")
        _ = loadIdentity(at: arguments["--identity"] ?? IdentityStore.defaultPath())  // logging set up, a note when created
        var transports = validTransports(arguments["--transport"] ?? "lan")
        if let adapter = arguments["--adapter"] {
            guard BluetoothTransportModule.isAdapterName(adapter) else { usageError("--adapter: '\(adapter)' is not hciN") }
            transports = transports.configuring(BluetoothTransportModule(adapter: adapter))
        }
        let inviteName = arguments["--invite"]
        let me: MultipeerPeerID
        do {
            me = try MultipeerPeerID(displayName: name.value, identityPath: arguments["--identity"] ?? IdentityStore.defaultPath())
        } catch {
            fail(error)
        }

        // The MultipeerConnectivity way: a session, an advertiser, a browser, delegates.
        let session = MultipeerSession(peer: me, encryptionPreference: .required, transports: transports)
        let (inputs, input) = AsyncStream.makeStream(of: Input.self)
        let delegate = Delegate(input: input, session: session)
        session.delegate = delegate
        let advertiser = NearbyServiceAdvertiser(peer: me, discoveryInfo: ["app": "mpcchat"], serviceType: service.value)
        advertiser.delegate = delegate
        advertiser.startAdvertisingPeer()
        let browser = NearbyServiceBrowser(peer: me, serviceType: service.value)
        browser.delegate = delegate
        browser.startBrowsingForPeers()
        readLines { input.yield($0.map(Input.line) ?? .endOfInput) }
        say("MPCChat as \(name) (id \(me.fingerprint.grouped)) on \(service.value) over \(transports).")

        var pending: [String] = []
        var invited: Set<Fingerprint> = []
        var inputEnded = false
        var status: Int32 = 0
        let giveUp = ContinuousClock.now + .seconds(60)
        loop: for await next in inputs {
            switch next {
            case .line(let line):
                pending.append(line)
            case .endOfInput:
                inputEnded = true
                if pending.isEmpty { break loop }
                Task {
                    try? await Task.sleep(until: giveUp)
                    input.yield(.failed("nobody connected within 60 s"))
                }
            case .found(let peer):
                say("+ \(peer.displayName) found")
                if peer.displayName == inviteName, invited.insert(peer.fingerprint).inserted {
                    browser.invitePeer(peer, to: session, withContext: Data("hello from \(name)".utf8), timeout: 30)
                }
            case .state(let peer, let state):
                if state != .connecting { say("* \(peer.displayName) \(state == .connected ? "connected" : "not connected")") }
            case .message(let peer, let data):
                say("\(peer.displayName): \(printable([UInt8](data)))")
            case .failed(let reason):
                note(reason)
                if inputEnded || reason.hasPrefix("advertising") {
                    status = 1
                    break loop
                }
            }
            // Lines go out once somebody is there to read them.
            let peers = session.connectedPeers
            while !pending.isEmpty, !peers.isEmpty {
                do {
                    try session.send(Data(pending[0].utf8), toPeers: peers, with: .reliable)
                    pending.removeFirst()
                } catch {
                    break  // a peer left between the look and the send
                }
            }
            if inputEnded && pending.isEmpty { break }
        }
        browser.stopBrowsingForPeers()
        advertiser.stopAdvertisingPeer()
        // The last lines go out before the goodbye; waiting for it means the peers see this
        // process leave at once, not as a lost link they wait for.
        await session.disconnect(waitingUpTo: .seconds(5))
        exit(status)
    }
}
