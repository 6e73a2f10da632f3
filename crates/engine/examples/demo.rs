//! A first look at txfs's engine on a real directory: a transaction is
//! invisible until it commits, conflicting transactions cannot both commit,
//! and a "crash" (the engine dropped without closing) loses nothing that
//! was committed. Run: `cargo run -p txfs-engine --example demo [BACKING]`.

use std::path::PathBuf;
use std::sync::Arc;
use txfs_engine::storage::RealFs;
use txfs_engine::{Durability, Engine, ObjId, Options};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backing = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join("txfs-demo"));
    let _ = std::fs::remove_dir_all(&backing);
    std::fs::create_dir_all(backing.join("mail"))?;
    std::fs::write(backing.join("mail/index"), "1 welcome\n")?;
    println!("backing directory: {}", backing.display());

    let open = || -> Result<Engine, Box<dyn std::error::Error>> {
        Ok(Engine::open(Arc::new(RealFs::open(&backing)?), Options::default())?)
    };
    let engine = open()?;
    let mail = engine.resolve(None, "mail".as_ref())?;
    let index = engine.resolve(None, "mail/index".as_ref())?;

    // 1. A message and its index entry, all or nothing.
    let tx = engine.begin();
    let msg = engine.create(Some(tx), mail, "2.eml".as_ref(), 0o644, 0, 0)?;
    engine.write(Some(tx), msg.obj, 0, b"Subject: hello\n\nattachment follows\n")?;
    engine.append(Some(tx), index, b"2 hello\n")?;
    let outside = engine.readdir(None, mail)?.len();
    println!("inside the transaction: 2.eml exists; others see {outside} entry in mail/");
    engine.commit(tx, Durability::Durable)?;
    println!(
        "after commit: others see {} entries; index = {:?}",
        engine.readdir(None, mail)?.len(),
        String::from_utf8_lossy(&engine.read(None, index, 0, 4096)?)
    );

    // 2. Two read-modify-write transactions on one file: one must lose.
    let (a, b) = (engine.begin(), engine.begin());
    let va = engine.read(Some(a), index, 0, 4096)?;
    let vb = engine.read(Some(b), index, 0, 4096)?;
    engine.write(Some(a), index, va.len() as u64, b"3 from A\n")?;
    engine.write(Some(b), index, vb.len() as u64, b"3 from B\n")?;
    engine.commit(a, Durability::Durable)?;
    match engine.commit(b, Durability::Durable) {
        Err(e) if e.is_conflict() => println!("second writer: {e} (errno {})", e.errno()),
        other => println!("unexpected: {other:?}"),
    }

    // 3. An ordered commit, then a crash before any checkpoint.
    let tx = engine.begin();
    let f = engine.create(Some(tx), ObjId::ROOT, "after-crash".as_ref(), 0o644, 0, 0)?;
    engine.write(Some(tx), f.obj, 0, b"survived\n")?;
    engine.commit(tx, Durability::Ordered)?;
    engine.sync()?;
    drop(engine); // no checkpoint: the commit lives only in the journal
    println!(
        "crashed; journal holds {} bytes",
        std::fs::metadata(backing.join(".txfs/journal/0000000000000001"))?.len()
    );
    let engine = open()?; // recovery replays the journal into plain files
    engine.close()?;
    println!("recovered; backing directory now holds plain files:");
    let mut listing = Vec::new();
    for dir in [backing.clone(), backing.join("mail")] {
        for e in std::fs::read_dir(&dir)? {
            let p = e?.path();
            if p.is_file() {
                listing.push(format!("  {} = {:?}", p.strip_prefix(&backing)?.display(), std::fs::read_to_string(&p)?));
            }
        }
    }
    listing.sort();
    println!("{}", listing.join("\n"));
    Ok(())
}
